"""Half-precision HNSW (pgvector 0.7+ ``halfvec``) against the full-precision index, on one big
collection: index size and build time, and recall@10 against an exact scan with p50/p95 at several
``ef_search`` (issue 15: "optional halfvec storage where available, measured").

    .venv/bin/python -m benchmarks.halfvec [--data-dir .bench-data/scale-1000000] [--queries 100]
        [--ef 40,100,200] [--drop]

The half-precision index is an expression index over the stored vectors
(``(embedding::halfvec(d)) halfvec_cosine_ops``, the full index's m and ef_construction), so the
table keeps its full-precision vectors and only the graph is halved; a query orders by the same
expression. It is built once (in memory, with one parallel worker, as ``benchmarks.scale`` builds
the full one) and kept for later runs unless ``--drop``. The collection is the one
``benchmarks.scale`` builds; the queries are SciFact's test queries, embedded by the local model.
The database is the data dir's embedded one, or ``RAGSVC_DATABASE_URL`` when set. Needs a server
whose pgvector has ``halfvec`` (0.7 or later): the embedded pgserver's is 0.6.2, so point
``RAGSVC_DATABASE_URL`` at a server with a newer one (docs/benchmarks.md, "Scale", says how it was run).
Prints one JSON object, with a calibration of the machine (the raw embedder's chunks/s) measured
in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from pgvector.sqlalchemy import HALFVEC
from sqlalchemy import cast, literal, text

from benchmarks.datasets import BENCH_DATA, open_runtime, scifact
from benchmarks.ir import latency, recall_at_k
from benchmarks.scale import COLLECTION, calibration, calibration_texts, seed, timed
from rag_service.db.models import Chunk
from rag_service.domain import SearchFilter
from rag_service.stores.pgvector import PgVectorStore
from rag_service.stores.pgvector.search import to_hits

INDEX = "ix_chunks_embedding_hnsw_half"
FULL_INDEX = "ix_chunks_embedding_hnsw"


async def build_index(runtime, dim: int) -> float | None:  # noqa: ANN001
    """Build the half-precision index with the full one's parameters; seconds, or None if it exists."""
    async with runtime.db.engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        if (await conn.execute(text("SELECT 1 FROM pg_indexes WHERE indexname = :i"), {"i": INDEX})).first():
            return None
        definition = (await conn.execute(text("SELECT indexdef FROM pg_indexes WHERE indexname = :i"),
                                         {"i": FULL_INDEX})).scalar_one()
        params = re.search(r"WITH \((.*)\)", definition)
        await conn.execute(text("SET statement_timeout = 0"))  # the service's bound is for queries
        await conn.execute(text("SET maintenance_work_mem = '4GB'"))
        await conn.execute(text("SET max_parallel_maintenance_workers = 1"))
        started = time.perf_counter()
        await conn.execute(text(
            f"CREATE INDEX {INDEX} ON chunks USING hnsw ((embedding::halfvec({dim})) halfvec_cosine_ops)"
            + (f" WITH ({params.group(1)})" if params else "")))
        await conn.execute(text("ANALYZE chunks"))
        return time.perf_counter() - started


async def half_search(runtime, store: PgVectorStore, vector: np.ndarray, flt: SearchFilter, top_k: int,  # noqa: ANN001
                      dim: int, ef: int) -> list:
    """The store's nearest-neighbour statement, ordered by the half-precision expression instead."""
    half = cast(Chunk.embedding, HALFVEC(dim))
    query = cast(literal(vector.tolist(), HALFVEC(dim)), HALFVEC(dim))
    stmt = store.vector_query(vector.tolist(), flt, top_k, dim).order_by(None).order_by(half.cosine_distance(query))
    async with runtime.db.connect() as conn:
        await conn.execute(text(f"SET LOCAL hnsw.ef_search = {ef}"))
        return to_hits((await conn.execute(stmt)).all())


async def measure(data_dir: Path, n_queries: int, efs: list[int], drop: bool) -> dict:
    runtime = open_runtime(data_dir)
    try:
        schema = await runtime.store.schema()
        if schema.pgvector_version < (0, 7):
            raise SystemExit(f"pgvector {'.'.join(map(str, schema.pgvector_version))} has no halfvec (0.7+)")
        dim = schema.embedding_dimension
        fixed_texts = calibration_texts(seed())
        before = calibration(runtime, fixed_texts)
        built = await build_index(runtime, dim)
        async with runtime.db.engine.connect() as conn:
            sizes = {name: (await conn.execute(text("SELECT pg_relation_size(CAST(:i AS regclass))"),
                                               {"i": name})).scalar_one() / 2**20 for name in (FULL_INDEX, INDEX)}
            chunks = (await conn.execute(text("SELECT count(*) FROM chunks"))).scalar_one()
        flt = SearchFilter(collection=COLLECTION)
        vectors = runtime.embedder.encode(list(scifact("test").queries.values())[:n_queries])
        truth = [{h.chunk_id for h in await runtime.store.vector_search(v, flt, 10, exact=True)} for v in vectors]
        out: dict = {"chunks": chunks, "pgvector": ".".join(map(str, schema.pgvector_version)),
                     "index_mb": {"full": round(sizes[FULL_INDEX], 1), "half": round(sizes[INDEX], 1)},
                     "half_build_s": None if built is None else round(built, 1), "full": {}, "half": {}}
        for ef in efs:
            store = PgVectorStore(runtime.db, ef_search=ef)
            for name, search in (("full", lambda v, s=store: s.vector_search(v, flt, 10)),
                                 ("half", lambda v, s=store, e=ef: half_search(runtime, s, v, flt, 10, dim, e))):
                await search(vectors[0])  # warm
                ms, hits = await timed([lambda v=v, f=search: f(v) for v in vectors])
                out[name][ef] = {**latency(ms), "recall_at_10": recall_at_k(hits, truth)}
        out["calibration_chunks_per_s"] = [round(before, 1),
                                           round(calibration(runtime, fixed_texts), 1)]
        if drop:
            async with runtime.db.engine.connect() as conn:
                conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
                await conn.execute(text(f"DROP INDEX {INDEX}"))
        return {**out, "date": datetime.now(UTC).isoformat(timespec="seconds")}
    finally:
        await runtime.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=BENCH_DATA / "scale-1000000")
    parser.add_argument("--queries", type=int, default=100, help="SciFact test queries to search with")
    parser.add_argument("--ef", default="40,100,200", help="hnsw.ef_search values")
    parser.add_argument("--drop", action="store_true", help="drop the half-precision index afterwards")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.data_dir, args.queries, [int(e) for e in args.ef.split(",")],
                                         args.drop))), flush=True)


if __name__ == "__main__":
    main()
