"""`POST /v1/search` at top_k 10 and 100 on SciFact, over HTTP, side by side (issue 15).

    .venv/bin/python -m benchmarks.wide_results [--rounds 2]

`ragsvc serve` with the defaults on the SciFact benchmark data dir (ingested first if needed); each of
the 300 test queries POSTed at each top_k over one keep-alive connection, the two alternating by
round. Reports the round trip's p50/p95, the server's own retrieval time (the response's
``elapsed_ms``) and the response size, so the difference splits into retrieval and the rest
(serialisation and transport). The raw embedder's chunks/s is printed beside them as the machine's
calibration.
"""

from __future__ import annotations

import argparse
import json
import time

import httpx
import numpy as np

from benchmarks.calibration import window_calibration
from benchmarks.datasets import BENCH_DATA, ingest_once, scifact
from benchmarks.server import serve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    data_dir = BENCH_DATA / "scifact"
    dataset = scifact("test")
    ingest_once(data_dir, dataset)
    queries = list(dataset.queries.values())
    before = window_calibration()
    rows = []
    with serve(data_dir) as base, httpx.Client(base_url=base, timeout=60) as client:
        def post(query: str, top_k: int) -> httpx.Response:
            return client.post("/v1/search", json={"query": query, "collection": dataset.collection, "top_k": top_k})

        for top_k in (10, 100):
            post(queries[0], top_k).raise_for_status()  # warm-up, not measured
        for round_ in range(args.rounds):
            for top_k in (10, 100):
                trip, server, size = [], [], []
                for query in queries:
                    started = time.perf_counter()
                    response = post(query, top_k)
                    trip.append((time.perf_counter() - started) * 1000)
                    response.raise_for_status()
                    server.append(response.json()["elapsed_ms"])
                    size.append(len(response.content))

                def pct(values: list[float], q: int) -> float:
                    return round(float(np.percentile(values, q)), 1)

                rows.append({"round": round_ + 1, "top_k": top_k, "round_trip_p50_ms": pct(trip, 50),
                             "round_trip_p95_ms": pct(trip, 95), "retrieval_p50_ms": pct(server, 50),
                             "retrieval_p95_ms": pct(server, 95), "response_bytes_p50": int(np.median(size))})
                print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"benchmark": "wide_results", "calibration_chunks_per_s": [before, window_calibration()]}))


if __name__ == "__main__":
    main()
