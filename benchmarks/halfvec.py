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
Searches go through the store (``RAGSVC_VECTOR_INDEX=half``'s path for the half index); at each
``ef_search`` both indexes are timed twice, alternating, and the second round is reported.
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
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import text

from benchmarks.calibration import calibration, calibration_texts
from benchmarks.datasets import BENCH_DATA, open_runtime, scifact
from benchmarks.ir import latency, recall_at_k
from benchmarks.scale import COLLECTION, seed, timed
from rag_service.domain import SearchFilter
from rag_service.stores.pgvector import PgVectorStore
from rag_service.stores.pgvector.half import HALF_INDEX, build_half_index, drop_half_index

FULL_INDEX = "ix_chunks_embedding_hnsw"  # migration 0001's


async def measure(data_dir: Path, n_queries: int, efs: list[int], drop: bool) -> dict:
    runtime = open_runtime(data_dir)
    try:
        schema = await runtime.store.schema()
        if schema.pgvector_version < (0, 7):
            raise SystemExit(f"pgvector {'.'.join(map(str, schema.pgvector_version))} has no halfvec (0.7+)")
        dim = schema.embedding_dimension
        fixed_texts = calibration_texts(seed())
        before = calibration(runtime, fixed_texts)
        # In memory, with one parallel worker, as benchmarks.scale builds the full index.
        built = await build_half_index(runtime.db, dim, m=runtime.settings.hnsw_m,
                                       ef_construction=runtime.settings.hnsw_ef_construction,
                                       maintenance_work_mem="4GB", parallel_workers=1)
        async with runtime.db.engine.connect() as conn:
            sizes = {name: (await conn.execute(text("SELECT pg_relation_size(CAST(:i AS regclass))"),
                                               {"i": name})).scalar_one() / 2**20 for name in (FULL_INDEX, HALF_INDEX)}
            chunks = (await conn.execute(text("SELECT count(*) FROM chunks"))).scalar_one()
        flt = SearchFilter(collection=COLLECTION)
        vectors = runtime.embedder.encode(list(scifact("test").queries.values())[:n_queries])
        truth = [{h.chunk_id for h in await runtime.store.vector_search(v, flt, 10, exact=True)} for v in vectors]
        out: dict = {"chunks": chunks, "pgvector": ".".join(map(str, schema.pgvector_version)),
                     "index_mb": {"full": round(sizes[FULL_INDEX], 1), "half": round(sizes[HALF_INDEX], 1)},
                     "half_build_s": None if built is None else round(built, 1), "full": {}, "half": {}}
        for ef in efs:
            full, half = PgVectorStore(runtime.db, ef_search=ef), PgVectorStore(runtime.db, ef_search=ef,
                                                                                 vector_index="half")
            # Two rounds, alternating, and the second one kept: each index is then as warm as the
            # other (a single round favoured whichever had just been built or read).
            for _ in range(2):
                for name, search in (("full", lambda v, s=full: s.vector_search(v, flt, 10)),
                                     ("half", lambda v, s=half: s.vector_search(v, flt, 10))):
                    ms, hits = await timed([lambda v=v, f=search: f(v) for v in vectors])
                    out[name][ef] = {**latency(ms), "recall_at_10": recall_at_k(hits, truth)}
        out["calibration_chunks_per_s"] = [round(before, 1),
                                           round(calibration(runtime, fixed_texts), 1)]
        if drop:
            await drop_half_index(runtime.db)
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
