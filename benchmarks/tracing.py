"""What Langfuse tracing costs a query, and what a slow or dead Langfuse costs: side by side.

    .venv/bin/python -m benchmarks.tracing [--data-dir .bench-data/xquad] [--limit 300] [--rounds 2]

The XQuAD paragraphs are ingested once (as for ``benchmarks.answers``); then ``ragsvc serve`` is
started in four configurations, in turn, ``--rounds`` times (interleaved, so drift hits all alike):

- ``off``: no Langfuse keys (the default);
- ``on``: keys set, Langfuse a local HTTP server that takes what the SDK sends (the test suite's fake,
  ``tests/langfuse_fake.py``: it decodes the OTLP spans and keeps the scores), answering at once;
- ``slow``: the same server answering every request after 2 s, with a queue of 20 traces;
- ``down``: the host a port nothing listens on.

Each configuration answers the first ``--limit`` questions one at a time (latency p50/p95 over HTTP)
and then 8 at a time (throughput). For ``on`` and ``slow`` the benchmark then counts the query traces
that reached the server and reads ``ragsvc_langfuse_traces_dropped_total`` from /metrics. Before the
first round it measures the raw embedder (256-token chunks/s) as the machine's calibration.

Ends with one JSON line of every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np

from benchmarks.answers import ask_all
from benchmarks.calibration import window_calibration
from benchmarks.datasets import BENCH_DATA, ingest_once, xquad, xquad_rows
from benchmarks.server import free_port, serve
from tests.langfuse_fake import SECRET_KEY, fake_langfuse

CONFIGS = ("off", "on", "slow", "down")
_DROPPED = re.compile(r"^ragsvc_langfuse_traces_dropped_total (\S+)$", re.M)


def log(message: str) -> None:
    print(message, flush=True)


def measure(config: str, data_dir: Path, rows: list[dict], round_no: int) -> dict:
    with ExitStack() as stack:
        env: dict[str, str] = {}
        fake = None
        if config in ("on", "slow"):
            # A fresh public key per server: the SDK keeps one client per key and process.
            fake = stack.enter_context(fake_langfuse(public_key=f"pk-lf-bench-{config}-{round_no}"))
            fake.delay_s = 2.0 if config == "slow" else 0.0
            fake.defer_decoding = True  # the fake's own work stays out of the measured window
            env = {"RAGSVC_LANGFUSE_HOST": fake.url, "RAGSVC_LANGFUSE_PUBLIC_KEY": fake.public_key,
                   "RAGSVC_LANGFUSE_SECRET_KEY": SECRET_KEY}
            if config == "slow":  # a small queue, so the run shows traces dropped rather than waited for
                env["RAGSVC_LANGFUSE_QUEUE_SIZE"] = "20"
        elif config == "down":
            env = {"RAGSVC_LANGFUSE_HOST": f"http://127.0.0.1:{free_port()}",
                   "RAGSVC_LANGFUSE_PUBLIC_KEY": "pk-lf-bench-down", "RAGSVC_LANGFUSE_SECRET_KEY": SECRET_KEY}
        base = stack.enter_context(serve(data_dir, **env))
        httpx.post(f"{base}/v1/query", json={"question": "warm up", "collection": "xquad"}, timeout=60)
        results, latencies, wall1 = asyncio.run(ask_all(base, rows, 1))
        _, _, wall8 = asyncio.run(ask_all(base, rows, 8))
        answered = sum(1 for r in results if r and r.get("outcome") == "answered")
        figures = {"config": config, "round": round_no,
                   "p50_ms": round(float(np.percentile(latencies, 50)), 1),
                   "p95_ms": round(float(np.percentile(latencies, 95)), 1),
                   "qps_c8": round(len(rows) / wall8, 1), "answered": answered, "errors": sum(
                       1 for r in results if r is None or "error" in r)}
        if config != "off":
            time.sleep(3)  # let the sender catch up with what it can
            found = _DROPPED.search(httpx.get(f"{base}/metrics", timeout=10).text)
            figures["dropped"] = float(found.group(1)) if found else None
        if fake is not None:
            fake.decode_deferred()
            figures["traces_received"] = len({s["trace_id"] for s in fake.spans if s["name"] == "query"})
            figures["scores_received"] = len(fake.scores)
        figures["sent_of"] = 2 * len(rows) + 1
    log(json.dumps(figures))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=BENCH_DATA / "xquad")
    parser.add_argument("--limit", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    dataset = xquad()
    rows = xquad_rows()[: args.limit]

    ingest_once(args.data_dir, dataset)
    chunks_per_s = window_calibration()
    log(f"calibration: raw embedder {chunks_per_s:.1f} chunks/s")
    runs = [measure(config, args.data_dir, rows, r) for r in range(args.rounds) for config in CONFIGS]
    summary = {}
    for config in CONFIGS:
        mine = [r for r in runs if r["config"] == config]
        summary[config] = {k: [r.get(k) for r in mine] for k in ("p50_ms", "p95_ms", "qps_c8", "dropped",
                                                                 "traces_received")}
    log(json.dumps({"benchmark": "tracing", "questions": len(rows), "rounds": args.rounds,
                    "calibration_chunks_per_s": round(chunks_per_s, 1), "summary": summary,
                    "date": datetime.now(UTC).isoformat(timespec="seconds"),
                    "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                "python": platform.python_version()}}))


if __name__ == "__main__":
    main()
