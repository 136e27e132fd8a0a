"""Where the slow searches' time goes: SciFact's 300 test queries through the search that
``POST /v1/search`` runs (default configuration, top 10), in process, on a data dir built by
``benchmarks.scale`` (default: the 1,000,000-chunk one).

    .venv/bin/python -m benchmarks.scale --sizes 1000000 --build-only   # once
    .venv/bin/python -m benchmarks.search_tail [--data-dir .bench-data/scale-1000000] [--passes 2]

Per pass: p50 / p95 / p99 / slowest, how many searches the adaptive loop took a second time,
nDCG@10 of SciFact's documents. The raw embedder's chunks/s (``benchmarks.calibration``) is
measured before and after the passes, since these machines differ by up to 2.5x in speed. Then
the slowest searches of the last pass, each with its iterations and every strategy's time in them
(the first pass starts on a cold cache). Ends with one JSON line of the figures. As a server does,
the process freezes its long-lived objects out of the garbage collector before timing.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from benchmarks.calibration import window_calibration
from benchmarks.datasets import BENCH_DATA, open_runtime, scifact
from benchmarks.ir import quality, ranking
from benchmarks.scale import COLLECTION
from rag_service.api.lifecycle import freeze_long_lived_objects
from rag_service.domain import SearchRequest
from rag_service.pipeline.retrieval.search import search


async def timed_searches(data_dir: Path, queries: dict[str, str], passes: int) -> list[list[dict]]:
    runtime = open_runtime(data_dir)
    out: list[list[dict]] = []
    try:
        # As a serving process does once its models load: without it, CPython's full collections
        # walk this process's ~450,000 long-lived objects (SciFact's corpus among them) and add up
        # to 195 ms to the searches they land in, which a server does not see.
        await runtime.warm_up_embedder()
        freeze_long_lived_objects()
        retriever = runtime.retriever
        for _ in range(passes):
            rows = []
            for qid, query in queries.items():
                started = time.perf_counter()
                result = await search(retriever, runtime.catalog, SearchRequest(query=query, collection=COLLECTION))
                rows.append({
                    "qid": qid, "ms": (time.perf_counter() - started) * 1000,
                    "rerank_ms": result.rerank.elapsed_ms if result.rerank else None,
                    "iterations": [{"action": it.action, "ms": round(it.elapsed_ms, 1), "strategies": [
                        (s.strategy, s.query[:30], round(s.elapsed_ms, 1)) for s in it.strategies]}
                        for it in result.iterations],
                    "documents": [r.source_uri for r in result.results],
                })
            out.append(rows)
    finally:
        gc.unfreeze()
        await runtime.close()
    return out


def ndcg_at_10(rows: list[dict], qrels: dict[str, dict[str, int]]) -> float:
    run = {row["qid"]: ranking(row["documents"]) for row in rows}  # a document ranks where its first chunk does
    return quality(qrels, run, ["ndcg@10"])["ndcg@10"]


def summary(rows: list[dict], qrels: dict[str, dict[str, int]]) -> dict:
    ms = np.array([r["ms"] for r in rows])
    return {"p50_ms": round(float(np.percentile(ms, 50)), 1), "p95_ms": round(float(np.percentile(ms, 95)), 1),
            "p99_ms": round(float(np.percentile(ms, 99)), 1), "slowest_ms": round(float(ms.max()), 1),
            "loop_fired": sum(len(r["iterations"]) > 1 for r in rows), "ndcg_at_10": ndcg_at_10(rows, qrels)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=BENCH_DATA / "scale-1000000")
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--slowest", type=int, default=10, help="how many of the last pass's slowest to show")
    args = parser.parse_args()
    if args.passes < 1:
        parser.error("--passes must be >= 1")
    if not (args.data_dir / "pg").exists():
        parser.error(f"{args.data_dir} holds no database: build it with benchmarks.scale first")
    dataset = scifact("test")
    before = window_calibration()
    passes = asyncio.run(timed_searches(args.data_dir, dataset.queries, args.passes))
    calibration = [before, window_calibration()]
    print(f"calibration: {calibration[0]} chunks/s before, {calibration[1]} after")
    figures = [summary(rows, dataset.qrels) for rows in passes]
    for number, figure in enumerate(figures, start=1):
        print(f"pass {number}: {json.dumps(figure)}")
    for row in sorted(passes[-1], key=lambda r: -r["ms"])[: args.slowest]:
        steps = "; ".join(f"{it['action']} {it['ms']} ms (" + ", ".join(f"{name} {ms}" for name, _, ms in
                                                                      it["strategies"]) + ")"
                          for it in row["iterations"])
        print(f"{row['ms']:8.1f} ms  rerank {row['rerank_ms'] or 0:.1f} ms  {steps}")
    print(json.dumps({"benchmark": "search_tail", "date": datetime.now(UTC).isoformat(timespec="seconds"),
                      "data_dir": str(args.data_dir), "passes": figures, "calibration_chunks_per_s": calibration}))


if __name__ == "__main__":
    main()
