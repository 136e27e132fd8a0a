"""SIGKILL the worker in the middle of a job, restart it: the job completes, no chunk is
duplicated, and at every moment each document is wholly its old version or wholly its new one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

RAGSVC = str(Path(sys.executable).parent / "ragsvc")
N_DOCS = 240


def _write_corpus(path: Path, version: int) -> None:
    rows = [{"_id": f"doc-{i}", "title": f"Document {i}",
             "text": f"Version {version} of document {i}. " + " ".join(f"fact{i}-{j}-v{version}." for j in range(40))}
            for i in range(N_DOCS)]
    path.write_text("\n".join(json.dumps(r) for r in rows))


def _env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGSVC_")}
    env.update(RAGSVC_DATABASE_URL=url, RAGSVC_INGEST_BATCH_DOCUMENTS="8", RAGSVC_WORKER_HEARTBEAT_S="0.5",
               RAGSVC_JOB_STALLED_AFTER_S="2", RAGSVC_CHUNK_SIZE="64", RAGSVC_CHUNK_OVERLAP="0")
    return env


def _snapshot(url: str) -> dict:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            duplicates = conn.execute(text(
                "SELECT count(*) FROM (SELECT document_id, ordinal FROM chunks GROUP BY 1, 2 HAVING count(*) > 1) d"
            )).scalar_one()
            rows = conn.execute(text(
                "SELECT d.source_uri, d.version, array_agg(DISTINCT substring(c.text from 'v([0-9])\\.')) "
                "FROM documents d JOIN chunks c ON c.document_id = d.id GROUP BY 1, 2")).all()
            job = conn.execute(text("SELECT status, progress, attempts, report FROM ingest_jobs")).one()
    finally:
        engine.dispose()
    return {"duplicates": duplicates, "docs": {r[0]: (r[1], set(r[2])) for r in rows}, "job": job}


def _assert_each_document_whole(snapshot: dict) -> None:
    assert snapshot["duplicates"] == 0
    for uri, (version, chunk_versions) in snapshot["docs"].items():
        assert chunk_versions == {str(version)}, f"{uri} is version {version} but has chunks of {chunk_versions}"


@pytest.mark.slow
def test_killed_worker_job_resumes_without_half_documents(databases, tmp_path: Path) -> None:
    url = databases.create()
    env = _env(url)
    corpus = tmp_path / "corpus.jsonl"
    _write_corpus(corpus, 1)
    first = subprocess.run([RAGSVC, "ingest", str(corpus), "--format", "beir", "-c", "crash", "--json"], env=env,
                           capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["documents"]["added"] == N_DOCS

    _write_corpus(corpus, 2)
    queued = subprocess.run([RAGSVC, "ingest", str(corpus), "--format", "beir", "-c", "crash", "--queue", "--json"],
                            env=env, capture_output=True, text=True, timeout=120)
    assert queued.returncode == 0, queued.stderr
    job_id = json.loads(queued.stdout)["job_id"]

    worker = subprocess.Popen([RAGSVC, "worker"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            done = (_snapshot(url)["job"].progress or {}).get("documents_done", 0)
            if done >= 40:
                break
            assert worker.poll() is None, worker.stderr.read()
            time.sleep(0.1)
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()

    mid = _snapshot(url)
    _assert_each_document_whole(mid)
    versions = [v for v, _ in mid["docs"].values()]
    assert len(mid["docs"]) == N_DOCS
    assert 0 < versions.count(2) < N_DOCS, "the kill must land mid-job for this test to mean anything"
    assert mid["job"].status == "running"

    restarted = subprocess.Popen([RAGSVC, "worker"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 text=True)
    try:
        deadline = time.monotonic() + 300
        while _snapshot(url)["job"].status not in ("succeeded", "failed"):
            assert time.monotonic() < deadline, "the job was not resumed"
            assert restarted.poll() is None, restarted.stderr.read()
            time.sleep(0.2)
    finally:
        restarted.send_signal(signal.SIGTERM)
        restarted.wait(timeout=60)

    final = _snapshot(url)
    _assert_each_document_whole(final)
    assert final["job"].status == "succeeded" and final["job"].attempts == 2
    assert {v for v, _ in final["docs"].values()} == {2}
    report = final["job"].report
    # The second attempt finished what the first had not committed, and skipped what it had.
    assert report["documents"]["updated"] + report["documents"]["unchanged"] == N_DOCS
    assert report["documents"]["unchanged"] == versions.count(2)
    assert job_id
