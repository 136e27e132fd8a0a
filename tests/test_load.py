"""The load benchmark's driver for 30 seconds (``benchmarks/load.py`` runs it for 10 minutes): 20 users
mixing search, query, streamed query, feedback and a trickle of ingestion against a real `ragsvc serve`
on a test database. No error other than the designed 429/503, every route served, memory and
PostgreSQL connections flat after the warm-up."""

from __future__ import annotations

import asyncio
import time

import psutil
import psycopg
import pytest

from benchmarks.load import growth, process_sampler, run_load
from benchmarks.server import serve
from tests.conftest import scratch_dir

TOPICS = ["tides and the moon", "bread dough and yeast", "volcanoes and magma", "honey bees and pollen",
          "glaciers and ice ages", "coffee roasting", "solar panels", "whale songs", "chess openings", "rainbows"]


@pytest.mark.slow
def test_thirty_seconds_of_mixed_load_has_no_unexpected_errors_and_no_growth(databases) -> None:
    url = databases.create()
    libpq = url.replace("postgresql+psycopg://", "postgresql://", 1)
    data_dir = scratch_dir("ragsvc-load-")
    with serve(data_dir, RAGSVC_DATABASE_URL=url, RAGSVC_SERVE_WORKER="on", RAGSVC_WORKER_HEARTBEAT_S="1") as base:
        import httpx

        docs = [{"source_uri": f"doc-{i}.md", "collection": "kb", "title": topic,
                 "text": f"This note is about {topic}. " + " ".join(f"Fact {j} about {topic} is recorded here."
                                                                    for j in range(20))}
                for i, topic in enumerate(TOPICS)]
        job = httpx.post(f"{base}/v1/documents", json=docs, timeout=60).json()
        for _ in range(600):
            if (status := httpx.get(f"{base}{job['status_url']}", timeout=10).json()["status"]) != "queued" and \
                    status != "running":
                break
            time.sleep(0.2)
        assert status == "succeeded", status
        port = int(base.rsplit(":", 1)[1])
        pid = next(c.pid for c in psutil.net_connections("tcp")
                   if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN)

        def connections() -> int:
            with psycopg.connect(libpq) as conn:
                return int(conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
                           .fetchone()[0])

        questions = [f"What is recorded about {topic}?" for topic in TOPICS]
        report = asyncio.run(run_load(base, questions, "kb", users=20, duration_s=30, warmup_s=8, think_s=0.5,
                                      sample=process_sampler(pid, None, connections), sample_every_s=2))
    summary = report.summary()
    assert summary["unexpected_errors"] == 0, summary["unexpected_examples"]
    for route in ("search", "query", "stream", "feedback", "ingest"):
        assert summary["routes"][route]["ok"] > 0, (route, summary["routes"][route])
    assert summary["routes"]["query"]["p95_ms"] < 10_000
    assert summary["throughput_ok_per_s"] > 2
    # Flat after the warm-up: memory within 150 MB, connections within the pools' bound.
    assert growth(report.samples, "server_rss_mb", 8) < 150, report.samples
    assert max(s["postgres_connections"] for s in report.samples) <= 70, report.samples
