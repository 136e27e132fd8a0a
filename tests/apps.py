"""The app on a test database: in process (TestClient) with a few documents ingested by its worker,
or under uvicorn in a thread for clients that need a real HTTP server."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn
from fastapi.testclient import TestClient

from rag_service.api import create_app
from rag_service.config import Settings, load_settings

SMALL_KB = [("tides.md", "Tides", "The gravitational pull of the moon raises the ocean tides twice a day."),
            ("bread.md", "Bread", "Knead the dough for ten minutes, then let it rise for about an hour.")]


def wait_for_job(get: Callable[[str], Any], status_url: str, timeout_s: float = 120) -> dict[str, Any]:
    """Poll an ingestion job's status URL with ``get`` (a client's, or one sending a key) until it
    ends; its final JSON."""
    deadline = time.monotonic() + timeout_s
    while (job := get(status_url).json())["status"] not in ("succeeded", "failed"):
        assert time.monotonic() < deadline, job
        time.sleep(0.2)
    return job


def ingest_and_wait(client: TestClient, documents: Any) -> None:
    """POST documents (JSON) and wait for the job to succeed."""
    response = client.post("/v1/documents", json=documents)
    assert response.status_code == 202, response.text
    job = wait_for_job(client.get, response.json()["status_url"])
    assert job["status"] == "succeeded", job


def client_with_documents(url: str, documents: list[tuple[str, str, str]] = SMALL_KB,
                          collection: str = "kb", **overrides: object) -> Iterator[TestClient]:
    """For a fixture: ``yield from client_with_documents(url)``; ``overrides`` are settings."""
    settings = load_settings(**{"database_url": url, "serve_worker": "on", "worker_heartbeat_s": 1, **overrides})
    with TestClient(create_app(settings)) as client:
        response = client.post("/v1/documents", json=[{"source_uri": u, "title": t, "text": x,
                                                       "collection": collection} for u, t, x in documents])
        assert response.status_code == 202, response.text
        wait_for_job(client.get, response.json()["status_url"])
        yield client


@contextmanager
def served(settings: Settings) -> Iterator[str]:
    """The app under uvicorn in a thread, on a socket bound here (no race for a free port); yields
    its base URL once /healthz answers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(create_app(settings), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="test-server", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert thread.is_alive(), "the server exited while starting"
            assert time.monotonic() < deadline, "the server did not answer /healthz within 60 s"
            time.sleep(0.05)
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        sock.close()
