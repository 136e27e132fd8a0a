"""The app in process (TestClient) on a test database, with a few documents ingested by its worker."""

from __future__ import annotations

import time
from collections.abc import Iterator

from fastapi.testclient import TestClient

from rag_service.api import create_app
from rag_service.config import load_settings

SMALL_KB = [("tides.md", "Tides", "The gravitational pull of the moon raises the ocean tides twice a day."),
            ("bread.md", "Bread", "Knead the dough for ten minutes, then let it rise for about an hour.")]


def client_with_documents(url: str, documents: list[tuple[str, str, str]] = SMALL_KB,
                          collection: str = "kb") -> Iterator[TestClient]:
    """For a fixture: ``yield from client_with_documents(url)``."""
    settings = load_settings(database_url=url, serve_worker="on", worker_heartbeat_s=1)
    with TestClient(create_app(settings)) as client:
        response = client.post("/v1/documents", json=[{"source_uri": u, "title": t, "text": x,
                                                       "collection": collection} for u, t, x in documents])
        assert response.status_code == 202, response.text
        deadline = time.monotonic() + 120
        while client.get(response.json()["status_url"]).json()["status"] not in ("succeeded", "failed"):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        yield client
