"""Load and soak: many simulated users against one `ragsvc serve`, over loopback.

    .venv/bin/python -m benchmarks.load [--users 100] [--duration 600] [--warmup 60] [--think 2.0] [--burst N]

SciFact's corpus is ingested once into the data dir (collection scifact); then ``ragsvc serve`` runs
with the defaults (its in-process worker included) and ``--users`` users, each in a loop: wait an
exponential think time (mean ``--think`` s), then search (35%), ask (35%), ask streaming (15%), or
rate an earlier answer (15%); a trickle of ingestion (one small document every 10 s, by whoever's turn
it is) runs alongside. Every 10 s the benchmark samples the server's RSS, PostgreSQL's processes' RSS
and its connection count.

For the second half of the warm-up, ``--burst`` more users without think time join (by default as
many as the server's in-flight bound), so the server works on as many queries at once as it ever
will before anything is measured. Python's and glibc's allocators keep the memory of their highest
concurrency as free space: without the burst, RSS stepped up each time the users happened to reach
a new peak of requests in flight (measured with tracemalloc and smaps: the live heap did not grow).

Reports, for the time after the warm-up: per route the count, p50/p95/p99 latency and status counts;
throughput; the errors that are not the designed 429/503 (a 503 carries Retry-After); and the RSS
and connection series, with their growth from the end of the warm-up to the end. Ends with one JSON
line of every figure. ``run_load`` is also what ``tests/test_load.py`` runs for 30 seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np
import psutil

ROUTES = ("search", "query", "stream", "feedback", "ingest")
DESIGNED = {429, 503}  # refusals by design (rate limit, in-flight bound, queue depth)


@dataclass
class LoadReport:
    latencies_ms: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    statuses: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    unexpected: list[str] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)
    measured_s: float = 0.0

    def record(self, route: str, status: int, ms: float, detail: str = "") -> None:
        self.statuses[route][status] += 1
        if 200 <= status < 300:
            self.latencies_ms[route].append(ms)
        elif status not in DESIGNED and len(self.unexpected) < 50:
            self.unexpected.append(f"{route} {status} {detail[:200]}")

    def summary(self) -> dict:
        routes = {}
        for route in ROUTES:
            done = self.latencies_ms.get(route, [])
            routes[route] = {"ok": len(done), "statuses": dict(self.statuses.get(route, {})), **(
                {f"p{q}_ms": round(float(np.percentile(done, q)), 1) for q in (50, 95, 99)} if done else {})}
        total_ok = sum(len(v) for v in self.latencies_ms.values())
        unexpected = sum(n for counts in self.statuses.values() for status, n in counts.items()
                         if not 200 <= status < 300 and status not in DESIGNED)
        return {"routes": routes, "throughput_ok_per_s": round(total_ok / self.measured_s, 1) if self.measured_s else 0,
                "unexpected_errors": unexpected, "unexpected_examples": self.unexpected[:10],
                "designed_refusals": sum(counts[s] for counts in self.statuses.values() for s in DESIGNED)}


async def run_load(base: str, questions: list[str], collection: str, *, users: int, duration_s: float,
                   warmup_s: float, think_s: float, sample: Callable[[], dict] | None = None,
                   sample_every_s: float = 10.0, seed: int = 0, burst_users: int = 0) -> LoadReport:
    """Drive ``users`` simulated users for ``duration_s`` (after ``warmup_s``, which is not counted).
    ``burst_users`` more users without think time join for the second half of the warm-up, so the
    server reaches its in-flight bound (and the memory that takes) before anything is measured."""
    report = LoadReport()
    rng = random.Random(seed)
    answers: list[str] = []
    start = time.monotonic()
    measure_from = start + warmup_s
    stop_at = measure_from + duration_s
    last_ingest = [start]
    # Idle connections are dropped before uvicorn's 5 s keep-alive ends them: with both at 5 s, a request
    # sent on a connection the server was closing failed with a ReadError (1 in 61,000 in a 23-minute soak).
    limits = httpx.Limits(max_connections=users + burst_users, max_keepalive_connections=users + burst_users,
                          keepalive_expiry=4.0)

    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as client:
        async def one(route: str) -> None:
            question = rng.choice(questions)
            sent = time.monotonic()  # counted by when it was sent: the warm-up's requests still in flight are not
            started = time.perf_counter()
            status, detail = 0, ""
            try:
                if route == "search":
                    r = await client.post("/v1/search", json={"query": question, "collection": collection})
                elif route == "query":
                    r = await client.post("/v1/query", json={"question": question, "collection": collection})
                    if r.status_code == 200:
                        answers.append(r.json()["query_id"])
                elif route == "stream":
                    async with client.stream("POST", "/v1/query/stream",
                                             json={"question": question, "collection": collection}) as r:
                        await r.aread()  # the whole stream, to its last event
                elif route == "feedback":
                    r = await client.post(f"/v1/answers/{rng.choice(answers)}/feedback",
                                          json={"rating": rng.choice([2, 4, 5]), "comment": "load test"})
                else:
                    r = await client.post("/v1/documents", json={
                        "source_uri": f"load-{time.time_ns()}.md", "collection": collection,
                        "text": f"A note written under load at {datetime.now(UTC).isoformat()}: {question}"})
                status, detail = r.status_code, "" if r.status_code < 400 else r.text[:200]
            except httpx.HTTPError as exc:
                detail = f"{type(exc).__name__}: {exc}"
            if sent >= measure_from:
                report.record(route, status, (time.perf_counter() - started) * 1000, detail)

        async def user(until: float = stop_at, think: float = think_s) -> None:
            while time.monotonic() < until:
                await asyncio.sleep(rng.expovariate(1 / think) if think > 0 else 0)
                if time.monotonic() >= until:
                    return
                if time.monotonic() - last_ingest[0] >= 10:
                    last_ingest[0] = time.monotonic()
                    route = "ingest"
                else:
                    roll = rng.random()
                    route = ("search" if roll < 0.35 else "query" if roll < 0.70 else "stream" if roll < 0.85
                             else "feedback" if answers else "query")
                await one(route)

        async def sampler() -> None:
            while time.monotonic() < stop_at and sample is not None:
                report.samples.append({"t_s": round(time.monotonic() - start, 1), **sample()})
                await asyncio.sleep(sample_every_s)

        async def burst() -> None:
            await asyncio.sleep(warmup_s / 2)
            await asyncio.gather(*[user(until=measure_from, think=0) for _ in range(burst_users)])

        tasks = [asyncio.create_task(user()) for _ in range(users)] + [asyncio.create_task(burst())]
        sampling = asyncio.create_task(sampler())
        await asyncio.gather(*tasks)
        sampling.cancel()
        if sample is not None:
            report.samples.append({"t_s": round(time.monotonic() - start, 1), **sample()})
    report.measured_s = time.monotonic() - measure_from
    return report


def process_sampler(server_pid: int, postmaster_pid: int | None,
                    count_connections: Callable[[], int]) -> Callable[[], dict]:
    """RSS of the server (with its children) and of PostgreSQL's processes, and PostgreSQL's connections."""
    def rss_tree(pid: int) -> int:
        try:
            root = psutil.Process(pid)
            return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
        except psutil.Error:
            return 0

    def sample() -> dict:
        return {"server_rss_mb": round(rss_tree(server_pid) / 2**20, 1),
                "postgres_rss_mb": round(rss_tree(postmaster_pid) / 2**20, 1) if postmaster_pid else None,
                "postgres_connections": count_connections()}
    return sample


def growth(samples: list[dict], key: str, after_s: float) -> float | None:
    """The change of ``key`` from the first sample at or after ``after_s`` to the last one."""
    kept = [s[key] for s in samples if s["t_s"] >= after_s and s.get(key) is not None]
    return round(kept[-1] - kept[0], 1) if len(kept) >= 2 else None


def slope_per_minute(samples: list[dict], key: str, after_s: float) -> dict | None:
    """The trend of ``key`` after ``after_s``, per minute: the Theil-Sen estimator with its 95%
    confidence interval (scipy.stats.theilslopes), robust to the steps an allocator's RSS moves in."""
    from scipy.stats import theilslopes

    kept = [(s["t_s"] / 60, s[key]) for s in samples if s["t_s"] >= after_s and s.get(key) is not None]
    if len(kept) < 3:
        return None
    slope, _, low, high = theilslopes([v for _, v in kept], [t for t, _ in kept], alpha=0.95)
    return {"per_min": round(float(slope), 3), "ci95": [round(float(low), 3), round(float(high), 3)]}


def main() -> None:
    from benchmarks.datasets import BENCH_DATA, ingest_once, scifact
    from benchmarks.server import serve

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # Its own data dir: the notes it ingests would otherwise change what the retrieval benchmarks find.
    parser.add_argument("--data-dir", type=Path, default=BENCH_DATA / "load")
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--duration", type=float, default=600, help="seconds measured, after the warm-up")
    parser.add_argument("--warmup", type=float, default=60)
    parser.add_argument("--think", type=float, default=2.0, help="mean think time between a user's requests (s)")
    parser.add_argument("--burst", type=int, default=None, help=(
        "users without think time added for the second half of the warm-up (default: the server's "
        "in-flight bound, RAGSVC_MAX_INFLIGHT_QUERIES), so it reaches its peak memory before measuring"))
    args = parser.parse_args()
    if args.burst is None:
        from rag_service.config import load_settings

        args.burst = load_settings().max_inflight_queries

    dataset = scifact("test")

    ingest_once(args.data_dir, dataset)
    questions = list(dataset.queries.values())
    with serve(args.data_dir) as base:
        port = int(base.rsplit(":", 1)[1])
        server_pid = next(c.pid for c in psutil.net_connections("tcp")
                          if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN)
        from rag_service.db.embedded import running_pid, start_embedded

        embedded = start_embedded(args.data_dir)

        def connections() -> int:
            import psycopg

            with psycopg.connect(embedded.admin_conninfo) as conn:
                return int(conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = 'ragsvc'").fetchone()[0])

        sample = process_sampler(server_pid, running_pid(args.data_dir), connections)
        report = asyncio.run(run_load(base, questions, "scifact", users=args.users, duration_s=args.duration,
                                      warmup_s=args.warmup, think_s=args.think, sample=sample,
                                      burst_users=args.burst))
    for s in report.samples:
        print(json.dumps(s), flush=True)
    print(json.dumps({
        "benchmark": "load", "users": args.users, "duration_s": args.duration, "warmup_s": args.warmup,
        "think_s": args.think, "burst_users": args.burst, **report.summary(),
        "server_rss_growth_mb_after_warmup": growth(report.samples, "server_rss_mb", args.warmup),
        "server_rss_slope_mb_after_warmup": slope_per_minute(report.samples, "server_rss_mb", args.warmup),
        "postgres_rss_growth_mb_after_warmup": growth(report.samples, "postgres_rss_mb", args.warmup),
        "postgres_connections_max": max((s["postgres_connections"] for s in report.samples), default=None),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()}}))


if __name__ == "__main__":
    main()
