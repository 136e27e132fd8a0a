"""The deployment's topology without containers: one PostgreSQL, two `ragsvc serve` processes with no
worker inside, two `ragsvc worker` processes. Ingestion jobs go to both APIs; one worker is killed
in the middle of a job. Every job finishes once, no chunk is duplicated, and both APIs answer the
same questions the same way."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

RAGSVC = str(Path(sys.executable).parent / "ragsvc")
JOBS, DOCS_PER_JOB = 4, 60
QUESTIONS = ("Which fact belongs to topic 7 of job 2?", "What does document 13 of job 0 say?",
             "Tell me about topic 3 in job 1.")


def _env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGSVC_")}
    env.update(RAGSVC_DATABASE_URL=url, RAGSVC_SERVE_WORKER="off", RAGSVC_HOST="127.0.0.1",
               RAGSVC_INGEST_BATCH_DOCUMENTS="8", RAGSVC_WORKER_HEARTBEAT_S="0.5", RAGSVC_JOB_STALLED_AFTER_S="2",
               RAGSVC_CHUNK_SIZE="64", RAGSVC_CHUNK_OVERLAP="0", RAGSVC_EXPERIMENT_CHECK_S="0")
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _documents(job: int) -> list[dict]:
    return [{"source_uri": f"job{job}-doc{i}", "title": f"Job {job} document {i}", "collection": "topo",
             "text": f"Document {i} of job {job} is about topic {i % 10}. " + " ".join(
                 f"Fact {j} of document {i} in job {job} concerns topic {i % 10} and measurement {i * j}."
                 for j in range(12))} for i in range(DOCS_PER_JOB)]


def _db(url: str, sql: str) -> list:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(text(sql)).all()
    finally:
        engine.dispose()


def _wait(predicate, seconds: float, what: str, processes: list[subprocess.Popen]) -> None:  # noqa: ANN001
    deadline = time.monotonic() + seconds
    while not predicate():
        for proc in processes:
            assert proc.poll() is None, f"{proc.args} exited with {proc.returncode} while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.mark.slow
def test_two_apis_and_two_workers_on_one_database(databases, tmp_path: Path) -> None:
    url = databases.create()
    env = _env(url)
    ports = [_free_port(), _free_port()]
    logs = [open(tmp_path / f"api{i}.log", "w") for i in range(2)]  # noqa: SIM115 - closed in finally
    apis = [subprocess.Popen([RAGSVC, "serve", "--port", str(port)], env=env, stdout=log, stderr=log)
            for port, log in zip(ports, logs, strict=True)]
    workers: list[subprocess.Popen] = []
    bases = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        def ready() -> bool:
            try:
                return all(httpx.get(f"{b}/readyz", timeout=2).status_code == 200 for b in bases)
            except httpx.HTTPError:
                return False

        _wait(ready, 180, "both APIs to be ready", apis)
        workers.append(subprocess.Popen([RAGSVC, "worker"], env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL))
        job_ids = []
        for job in range(JOBS):  # alternately to each API
            posted = httpx.post(f"{bases[job % 2]}/v1/documents", json=_documents(job), timeout=30)
            assert posted.status_code == 202, posted.text
            job_ids.append(posted.json()["job_id"])

        def status(job_id: str) -> dict:
            return httpx.get(f"{bases[0]}/v1/jobs/{job_id}", timeout=10).json()

        def one_mid_job() -> bool:
            return any(s["status"] == "running" and 8 <= (s.get("progress") or {}).get("documents_done", 0)
                       < DOCS_PER_JOB for s in map(status, job_ids))

        _wait(one_mid_job, 180, "a job half done", apis + workers)
        workers.append(subprocess.Popen([RAGSVC, "worker"], env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL))
        workers[0].send_signal(signal.SIGKILL)  # the only worker so far: the running job was its
        workers[0].wait(timeout=30)
        _wait(lambda: all(status(j)["status"] in ("succeeded", "failed") for j in job_ids), 300,
              "every job to finish", apis + workers[1:])

        finished = [status(j) for j in job_ids]
        assert [s["status"] for s in finished] == ["succeeded"] * JOBS, finished
        attempts = dict(_db(url, "SELECT id::text, attempts FROM ingest_jobs"))
        assert sorted(attempts.values()) == [1] * (JOBS - 1) + [2]  # the killed job ran again, once
        assert _db(url, "SELECT count(*) FROM documents")[0][0] == JOBS * DOCS_PER_JOB
        duplicated = _db(url, "SELECT count(*) FROM (SELECT document_id, ordinal FROM chunks GROUP BY 1, 2 "
                              "HAVING count(*) > 1) d")[0][0]
        assert duplicated == 0

        # One unmeasured question per replica first: a cold replica's first query can run past the
        # reranker's or the adaptive loop's time budget under the suite's load (timing, not state).
        for b in bases:
            httpx.post(f"{b}/v1/query", json={"question": "What is topic 1 about?", "collection": "topo"},
                       timeout=60).raise_for_status()
        for question in QUESTIONS:
            answers = [httpx.post(f"{b}/v1/query", json={"question": question, "collection": "topo"},
                                  timeout=60).json() for b in bases]
            same = [(a["outcome"], a["answer"], [c["source_uri"] for c in a["citations"]]) for a in answers]
            assert same[0] == same[1], (same, [a.get("retrieval") for a in answers])
            assert answers[0]["query_id"] != answers[1]["query_id"]
    finally:
        for proc in apis + workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in apis + workers:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        for log in logs:
            log.close()
