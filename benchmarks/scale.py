"""How search, hybrid query and ingestion costs grow with a collection's size (issue 15).

    .venv/bin/python -m benchmarks.scale --sizes 10000,100000 [--json] [--ef 40,100,200,400]
        [--recall-queries 100] [--skip-http] [--build-only] [--keyword-engine tantivy] [--sql-queries 60]
        [--vectors local|isotropic] [--hnsw-during-load] [--filtered-only]

Each size gets its own data dir (``.bench-data/scale-N``, or ``scale-N-isotropic`` for the first
version's vectors; its own embedded PostgreSQL), holding one
collection ``scifact`` built by ``benchmarks/scale_data.py``: the real SciFact documents (chunks and
vectors as the service ingested them, read from the SciFact benchmark data dir) plus generated
documents up to N searchable chunks. A data dir already holding N chunks is reused (remove it to
build again); one holding fewer resumes the build (its build time is then not reported). For
each size, over SciFact's 300 test queries (their relevant documents are in every collection):

- build seconds (through the store's bulk write path) and the database's size on disk. A fresh build
  drops the HNSW index, loads, and builds the index once at the end (in memory, with a parallel
  worker), as one would for a bulk import; ``--hnsw-during-load`` keeps it and maintains the graph
  row by row as ingestion does (about 70 minutes against about 55 for 1,000,000 chunks here);
- semantic search in the store (HNSW) at several ``ef_search``: p50/p95 and recall@10 against an
  exact scan over the same collection (on the first ``--recall-queries`` queries);
- keyword (BM25) in the store with ``--keyword-engine`` (the tantivy index is built first, and its
  build timed): p50/p95 over all queries and over the queries holding a common term (one in at
  least 5% of the chunks); with tantivy, the SQL scoring beside it on the first ``--sql-queries``;
- over HTTP (``ragsvc serve``, default configuration): ``/v1/search`` top_k 10 (the default hybrid
  route) and ``/v1/query`` (no LLM) p50/p95 at concurrency 1 and requests/s at concurrency 16, and
  SciFact nDCG@10 of ``/v1/search``'s results;
- a calibration of the machine in the same run: the raw embedder's chunks/s on 256 fixed SciFact
  chunks, before and after the size's measurements (these machines differ by up to 2.5x).

Prints a table at the end; with --json only one JSON object per line per size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np
from sqlalchemy import text

from benchmarks.calibration import calibration, calibration_texts
from benchmarks.datasets import BENCH_DATA, ingest_once, open_runtime, scifact
from benchmarks.ir import latency, quality, ranking, recall_at_k
from benchmarks.scale_data import (
    SEED_COLLECTION,
    VECTOR_MODES,
    Seed,
    build,
    chunk_count,
    drop_hnsw,
    ensure_hnsw,
    load_seed,
    log,
    maintenance,
    read_seed,
    save_seed,
    source_uris,
)
from benchmarks.server import serve
from rag_service.config import load_settings
from rag_service.domain import SearchFilter
from rag_service.stores.pgvector import PgVectorStore

COLLECTION = SEED_COLLECTION
COMMON_DF = 0.05  # a term in at least this share of the chunks is "common"
SEED_FILE = BENCH_DATA / "scale-seed.npz"


def seed() -> Seed:
    """SciFact as ingested (the SciFact benchmark data dir, ingested first if needed), cached."""
    if not SEED_FILE.exists():
        data_dir = BENCH_DATA / "scifact"
        ingest_once(data_dir, scifact("test"))

        async def read() -> Seed:
            runtime = open_runtime(data_dir)
            try:
                return await read_seed(runtime)
            finally:
                await runtime.close()

        found = asyncio.run(read())
        # Only the corpus's own documents (the data dir may hold others, such as an old load run's notes).
        corpus = {json.loads(line)["_id"] for line in scifact("test").corpus.read_text().splitlines() if line}
        found.documents = [d for d in found.documents if d.source_uri in corpus]
        save_seed(found, SEED_FILE)
    return load_seed(SEED_FILE)


async def common_queries(runtime, queries: list[str]) -> list[str]:  # noqa: ANN001
    """The queries holding a term found in at least COMMON_DF of the collection's chunks."""
    async with runtime.db.engine.connect() as conn:
        n = await chunk_count(runtime)
        out = []
        for query in queries:
            df = (await conn.execute(text(
                "SELECT max(df) FROM (SELECT count(*) AS df FROM keyword_postings p "
                "JOIN collections k ON k.id = p.collection_id WHERE k.name = :c AND p.term IN "
                "(SELECT lexeme FROM unnest(to_tsvector(CAST(:cfg AS regconfig), :q))) GROUP BY p.term) x"),
                {"c": COLLECTION, "q": query, "cfg": runtime.settings.text_search_config})).scalar_one()
            if df is not None and df >= COMMON_DF * n:
                out.append(query)
        return out


async def timed(calls) -> tuple[list[float], list]:  # noqa: ANN001
    ms, results = [], []
    for call in calls:
        started = time.perf_counter()
        results.append(await call())
        ms.append((time.perf_counter() - started) * 1000)
    return ms, results


async def keyword_engine_figures(runtime, queries: list[str], sql_queries: int) -> dict:  # noqa: ANN001
    """Build (or load) the tantivy index and time it; the SQL scoring on the first queries beside it."""
    index = runtime.store.term_index
    if index is None:
        return {}
    async with runtime.db.engine.connect() as conn:
        collection_id = (await conn.execute(text("SELECT id FROM collections WHERE name = :c"),
                                            {"c": COLLECTION})).scalar_one()
    started = time.perf_counter()
    if not await index.ready(collection_id):
        raise SystemExit("the tantivy keyword index could not be built (see the log)")
    build_s = round(time.perf_counter() - started, 1)
    sql = PgVectorStore(runtime.db)
    flt = SearchFilter(collection=COLLECTION)
    await sql.keyword_search(queries[0], flt, 10)  # warm
    sql_ms, _ = await timed([lambda q=q: sql.keyword_search(q, flt, 10) for q in queries[:sql_queries]])
    return {"index_build_or_load_s": build_s, "sql": {**latency(sql_ms), "queries": len(sql_ms)}}


FILTER_SHARES = {"b1000": 0.001, "b100": 0.01, "b10": 0.1, "b2": 0.5}  # metadata key -> share it keeps


async def label_buckets(runtime) -> None:  # noqa: ANN001
    """Give every document of the collection the metadata keys ``b1000``/``b100``/``b10``/``b2``
    (a stable hash of its source URI modulo 1000/100/10/2), so that ``{"b100": 0}`` keeps about 1%
    of the chunks; done once per data dir."""
    buckets = ", ".join(f"'{key}', abs(hashtext(source_uri)) % {round(1 / share)}"
                        for key, share in FILTER_SHARES.items())
    async with runtime.db.engine.begin() as conn:
        updated = await conn.execute(text(
            f"UPDATE documents SET metadata = metadata || jsonb_build_object({buckets}) "
            "WHERE collection_id = (SELECT id FROM collections WHERE name = :c) AND NOT metadata ? 'b2'"),
            {"c": COLLECTION})
    if updated.rowcount:
        async with runtime.db.engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.execute(text("VACUUM ANALYZE documents"))


def _second_steps(store: PgVectorStore) -> dict[str, int]:
    """How many of the store's searches so far needed a second step after the first index scan."""
    return {"widened": store.vector_widened, "iterative": store.vector_iterative,
            "exact": store.vector_exact_fallbacks}


async def filtered_figures(runtime, vectors: np.ndarray, top_k: int = 10) -> dict:  # noqa: ANN001
    """Semantic top k under metadata filters keeping 0.1% to 50% of the chunks: p50/p95, recall@k
    against an exact scan under the same filter, and the share of queries given all k. (Top 100 is
    what the retriever's semantic leg asks for.)"""
    await label_buckets(runtime)
    store = runtime.store
    out = {}
    for key, share in FILTER_SHARES.items():
        flt = SearchFilter(collection=COLLECTION, metadata_equals={key: 0})
        truth = [{h.chunk_id for h in await store.vector_search(v, flt, top_k, exact=True)} for v in vectors]
        await store.vector_search(vectors[0], flt, top_k)  # warm
        before = _second_steps(store)
        ms, hits = await timed([lambda v=v, f=flt: store.vector_search(v, f, top_k) for v in vectors])
        # How the timed searches were answered after the first index scan (the rest by it alone).
        steps = {step: n - before[step] for step, n in _second_steps(store).items()}
        out[str(share)] = {**latency(ms), "recall_at_10": recall_at_k(hits, truth),
                           "filled": round(float(np.mean([len(h) >= min(top_k, len(t)) for h, t in
                                                          zip(hits, truth, strict=True)])), 4), **steps}
    return out


async def store_figures(runtime, queries: list[str], efs: list[int], recall_queries: int,  # noqa: ANN001
                        sql_queries: int = 60) -> dict:
    flt = SearchFilter(collection=COLLECTION)
    vectors = runtime.embedder.encode(queries)
    exact_store = runtime.store
    truth = []
    for v in vectors[:recall_queries]:
        truth.append({h.chunk_id for h in await exact_store.vector_search(v, flt, 10, exact=True)})
    semantic = {}
    for ef in efs:
        store = PgVectorStore(runtime.db, ef_search=ef, pattern_timeout_ms=runtime.settings.pattern_timeout_ms)
        await store.vector_search(vectors[0], flt, 10)  # warm
        ms, hits = await timed([lambda v=v, s=store: s.vector_search(v, flt, 10) for v in vectors])
        # Recall on the first recall_queries, which have an exact top 10.
        semantic[ef] = {**latency(ms), "recall_at_10": recall_at_k(hits[:len(truth)], truth)}
    filtered = await filtered_figures(runtime, vectors[:recall_queries])
    common = await common_queries(runtime, queries)
    engine = await keyword_engine_figures(runtime, queries, sql_queries)
    await runtime.store.keyword_search(queries[0], flt, 10)  # warm
    keyword_ms, _ = await timed([lambda q=q: runtime.store.keyword_search(q, flt, 10) for q in queries])
    common_ms, _ = await timed([lambda q=q: runtime.store.keyword_search(q, flt, 10) for q in common])
    index = runtime.store.term_index
    if index is not None:
        engine["answered_by_index"], engine["answered_by_sql"] = index.answered, index.fell_back
    return {"semantic": semantic, "semantic_filtered": filtered, "keyword": latency(keyword_ms),
            "keyword_common": {**latency(common_ms), "queries": len(common)}, "keyword_engine": engine}


def http_figures(data_dir: Path, queries: dict[str, str], qrels: dict, keyword_engine: str) -> dict:
    """/v1/search and /v1/query one at a time, then 16 at a time."""
    with serve(data_dir, RAGSVC_KEYWORD_ENGINE=keyword_engine) as base:
        with httpx.Client(base_url=base, timeout=120) as client:
            def search(q: str) -> httpx.Response:
                return client.post("/v1/search", json={"query": q, "collection": COLLECTION, "top_k": 10})

            def ask(q: str) -> httpx.Response:
                return client.post("/v1/query", json={"question": q, "collection": COLLECTION})

            search(next(iter(queries.values())))
            ask(next(iter(queries.values())))
            run, search_ms, query_ms = {}, [], []
            for qid, q in queries.items():
                started = time.perf_counter()
                r = search(q)
                search_ms.append((time.perf_counter() - started) * 1000)
                r.raise_for_status()
                run[qid] = ranking(h["source_uri"] for h in r.json()["results"])
            for q in queries.values():
                started = time.perf_counter()
                ask(q).raise_for_status()
                query_ms.append((time.perf_counter() - started) * 1000)
        search_qps = asyncio.run(_qps(base, "/v1/search", [{"query": q, "collection": COLLECTION, "top_k": 10}
                                                           for q in queries.values()]))
        query_qps = asyncio.run(_qps(base, "/v1/query", [{"question": q, "collection": COLLECTION}
                                                         for q in queries.values()]))
    return {"search": {**latency(search_ms), "qps_16": search_qps}, "query": {**latency(query_ms), "qps_16": query_qps},
            **quality({q: qrels[q] for q in run}, run, ("ndcg@10",))}


async def _qps(base: str, path: str, bodies: list[dict], concurrency: int = 16) -> float:
    pending = list(bodies)
    limits = httpx.Limits(max_connections=concurrency, keepalive_expiry=4.0)
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as client:
        async def worker() -> None:
            while pending:
                (await client.post(path, json=pending.pop())).raise_for_status()

        started = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(concurrency)])
        return round(len(bodies) / (time.perf_counter() - started), 1)


def measure_size(size: int, the_seed: Seed, args: argparse.Namespace) -> dict:
    """One size: build (or resume) its collection and measure it; {} with --build-only."""
    data_dir = BENCH_DATA / (f"scale-{size}" if args.vectors == "local" else f"scale-{size}-{args.vectors}")
    dataset = scifact("test")
    queries = list(dataset.queries.values())
    fixed_texts = calibration_texts(the_seed)

    async def store_part() -> dict:
        runtime = open_runtime(data_dir, keyword_engine=args.keyword_engine)
        try:
            if args.filtered_only:
                vectors = runtime.embedder.encode(queries)[:args.recall_queries]
                return {"chunks": await chunk_count(runtime), "filtered_only": {
                    str(k): await filtered_figures(runtime, vectors, k) for k in (10, 100)}}
            before = None if args.build_only else calibration(runtime, fixed_texts)
            build_s = seconds = None
            held = await chunk_count(runtime)
            if held < max(size, the_seed.chunk_count):
                present = await source_uris(runtime)
                log(f"building {size:,} chunks in {data_dir}" + (f" (resuming: {held:,} there)" if held else ""))
                if not held and not args.hnsw_during_load:
                    await drop_hnsw(runtime, data_dir)
                seconds = await build(runtime.store, the_seed, COLLECTION, size, present=present,
                                      vectors=args.vectors, progress=lambda n: log(f"  {n:,} / {size:,} chunks"))
                seconds = round(seconds + (await ensure_hnsw(runtime, data_dir) or 0.0), 1)
                # A resumed build's time covers only its own part: not reported as the build time.
                build_s = None if held else seconds
            elif (took := await ensure_hnsw(runtime, data_dir)) is not None:  # a bulk load cut short before it
                log(f"  rebuilt the HNSW index a bulk load had dropped in {took:.0f} s")
            if held > max(size, the_seed.chunk_count):
                raise SystemExit(f"{data_dir} holds {held:,} chunks, more than {size:,}: remove it to build again")
            if args.build_only:
                took = f", built in {seconds} s" if seconds is not None else ""
                log(f"{data_dir}: {await chunk_count(runtime):,} chunks{took} (build only: nothing measured)")
                return {}
            disk_mb = await maintenance(runtime)
            figures = await store_figures(runtime, queries, args.ef, args.recall_queries, args.sql_queries)
            return {"chunks": await chunk_count(runtime), "build_s": build_s, "disk_mb": disk_mb, **figures,
                    "calibration_before": before}
        finally:
            await runtime.close()

    result = asyncio.run(store_part())
    if not result:  # --build-only
        return {}
    if "filtered_only" in result:
        return {**result, "date": datetime.now(UTC).isoformat(timespec="seconds")}
    http = {} if args.skip_http else http_figures(data_dir, dataset.queries, dataset.qrels, args.keyword_engine)

    async def after() -> float:
        runtime = open_runtime(data_dir)
        try:
            return calibration(runtime, fixed_texts)
        finally:
            await runtime.close()

    result["calibration_after"] = asyncio.run(after())
    default_ef = str(args.default_ef)
    semantic = result["semantic"].get(args.default_ef) or next(iter(result["semantic"].values()))
    return {
        "chunks": result["chunks"], "build_s": result["build_s"], "disk_mb": result["disk_mb"],
        "keyword_engine": args.keyword_engine, "vectors": args.vectors, "ef_search": args.default_ef,
        "semantic_p95_ms": semantic["p95_ms"], "semantic_recall_at_10": semantic["recall_at_10"],
        "keyword_p95_ms": result["keyword"]["p95_ms"], "keyword_common_p95_ms": result["keyword_common"]["p95_ms"],
        "hybrid_p95_ms": http.get("search", {}).get("p95_ms"), "query_p95_ms": http.get("query", {}).get("p95_ms"),
        "query_qps_16": http.get("query", {}).get("qps_16"), "ndcg_at_10": http.get("ndcg@10"),
        "calibration_chunks_per_s": round((result["calibration_before"] + result["calibration_after"]) / 2, 1),
        "detail": {"semantic_by_ef_search": {str(k): v for k, v in result["semantic"].items()},
                   "semantic_filtered_by_share": result["semantic_filtered"],
                   "semantic_ef_search": default_ef, "keyword": result["keyword"],
                   "keyword_common": result["keyword_common"], "keyword_engine": result["keyword_engine"],
                   "http": http,
                   "calibration_before_after": [result["calibration_before"], result["calibration_after"]]},
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
    }


def table(rows: list[dict]) -> str:
    head = ("| chunks | build s | disk MB | semantic p95 ms (recall@10) | keyword p95 / common p95 ms | "
            "/v1/search p95 ms | /v1/query p95 ms | query/s at 16 | nDCG@10 | calibration chunks/s |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        lines.append(f"| {r['chunks']:,} | {r['build_s']} | {r['disk_mb']:,} | {r['semantic_p95_ms']} "
                     f"({r['semantic_recall_at_10']}) | {r['keyword_p95_ms']} / {r['keyword_common_p95_ms']} | "
                     f"{r['hybrid_p95_ms']} | {r['query_p95_ms']} | {r['query_qps_16']} | {r['ndcg_at_10']} | "
                     f"{r['calibration_chunks_per_s']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000", help="comma-separated chunk counts")
    parser.add_argument("--ef", default="40,100,200,400", help="hnsw.ef_search values to measure")
    parser.add_argument("--default-ef", type=int, default=load_settings().hnsw_ef_search,
                        help="the ef_search the headline figures use (default: the service's, RAGSVC_HNSW_EF_SEARCH)")
    parser.add_argument("--recall-queries", type=int, default=100, help="queries with an exact scan for recall")
    parser.add_argument("--skip-http", action="store_true", help="store-level figures only")
    parser.add_argument("--build-only", action="store_true",
                        help="build (or resume building) each size's collection, measure nothing")
    parser.add_argument("--json", action="store_true", help="only one JSON object per line per size")
    parser.add_argument("--filtered-only", action="store_true",
                        help="on built data dirs, only semantic search under filters, at top 10 and top 100")
    parser.add_argument("--keyword-engine", choices=("auto", "postgres", "tantivy"), default="auto",
                        help="BM25 top k: as the service chooses (auto), in SQL, or from the tantivy index "
                             "(RAGSVC_KEYWORD_ENGINE)")
    parser.add_argument("--sql-queries", type=int, default=60,
                        help="with --keyword-engine tantivy: queries timed with the SQL scoring beside it")
    parser.add_argument("--vectors", choices=VECTOR_MODES, default="local",
                        help="how generated vectors sit around their real topic (benchmarks/scale_data.py)")
    parser.add_argument("--hnsw-during-load", action="store_true",
                        help="keep the HNSW index during a fresh build (maintained row by row) instead of "
                             "building it once after the load")
    args = parser.parse_args()
    args.ef = sorted({int(x) for x in args.ef.split(",")} | {args.default_ef})
    the_seed = seed()
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        row = measure_size(size, the_seed, args)
        if not row:  # --build-only
            continue
        rows.append(row)
        print(json.dumps(row if args.json else {k: v for k, v in row.items() if k != "detail"}), flush=True)
    if rows and not args.json and not args.filtered_only:
        print(table(rows))


if __name__ == "__main__":
    main()
