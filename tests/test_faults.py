"""Faults: PostgreSQL stopped under a running service and started again. Queries and uploads get a
503 that names the database while it is down (fast, not a hang), nothing is acknowledged that is not
stored, and the service recovers by itself when the server is back. On a PostgreSQL server of its own
(the embedded one, started for this module), since the test stops it."""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from tests.apps import client_with_documents
from tests.conftest import EXTERNAL_DATABASE_URL, DatabaseFactory, scratch_dir

pytestmark = pytest.mark.skipif(EXTERNAL_DATABASE_URL is not None,
                                reason="stops its PostgreSQL server: runs on an embedded one only")


@pytest.fixture(scope="module")
def server() -> Iterator[object]:
    import pgserver

    root = scratch_dir("ragsvc-fault-pg-")
    server = pgserver.get_server(root / "pg", cleanup_mode="delete")
    yield server
    server.cleanup()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def client(server) -> Iterator[TestClient]:  # noqa: ANN001 - pgserver's PostgresServer
    url = DatabaseFactory(server.get_uri("postgres")).create()
    yield from client_with_documents(url)


def stop(server) -> None:  # noqa: ANN001
    pid = server.get_postmaster_info().pid
    os.kill(pid, signal.SIGINT)  # PostgreSQL's fast shutdown: sessions are cut, nothing is kept open
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError("PostgreSQL did not stop")


def test_postgresql_down_is_a_prompt_503_and_the_service_recovers_without_a_restart(client: TestClient,
                                                                                    server) -> None:  # noqa: ANN001
    question = {"question": "What raises the ocean tides twice a day?", "collection": "kb"}
    assert client.post("/v1/query", json=question).status_code == 200
    jobs_before = client.get("/v1/jobs").json()["count"]

    stop(server)
    try:
        started = time.perf_counter()
        down = client.post("/v1/query", json=question)
        assert down.status_code == 503, down.text
        assert "database" in down.json()["detail"].lower() or "postgres" in down.json()["detail"].lower()
        assert time.perf_counter() - started < 15
        ready = client.get("/readyz")
        assert ready.status_code == 503 and "database" in ready.json()["checks"]
        upload = client.post("/v1/documents", json={"source_uri": "lost.md", "text": "Never acknowledged.",
                                                     "collection": "kb"})
        assert upload.status_code == 503, upload.text  # refused, not acknowledged and then lost
        assert client.get("/healthz").status_code == 200  # the process itself is alive
    finally:
        server.ensure_postgres_running()

    deadline = time.monotonic() + 60
    while (again := client.post("/v1/query", json=question)).status_code != 200:
        assert time.monotonic() < deadline, again.text
        time.sleep(0.5)
    assert again.json()["citations"][0]["source_uri"] == "tides.md"
    assert client.get("/readyz").status_code == 200
    # The refused upload left nothing behind; a new one is acknowledged and done.
    assert client.get("/v1/jobs").json()["count"] == jobs_before
    accepted = client.post("/v1/documents", json={"source_uri": "moon.md", "text": "The moon orbits the earth.",
                                                   "collection": "kb"})
    assert accepted.status_code == 202
    deadline = time.monotonic() + 60
    while (job := client.get(accepted.json()["status_url"]).json())["status"] not in ("succeeded", "failed"):
        assert time.monotonic() < deadline, job
        time.sleep(0.2)
    assert job["status"] == "succeeded"
