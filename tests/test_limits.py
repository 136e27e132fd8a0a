"""Limits and backpressure: requests per key (429 + Retry-After), queries in flight per process (503 +
Retry-After), the ingestion queue's depth, upload sizes and counts, and GET /v1/health/queues. Real
PostgreSQL; the in-flight bound also alone, on an ASGI app that holds its requests open."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from rag_service.api import create_app
from rag_service.api.limits import InFlight, InFlightBound
from rag_service.config import load_settings
from tests.test_auth import bearer, create_key


@pytest.fixture(scope="module")
def url(databases) -> str:
    return databases.create()


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[TestClient]:
    # No worker: jobs stay queued, so the queue's bound can be reached with two uploads.
    settings = load_settings(database_url=url, serve_worker="off", rate_limit="4/minute", max_queued_jobs=1,
                             ingest_max_files=2, ingest_max_request_bytes=2000)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def test_a_key_over_its_rate_gets_429_with_retry_after_and_other_keys_do_not(client: TestClient, url: str) -> None:
    busy, quiet = create_key(url, "reader", name="busy"), create_key(url, "reader", name="quiet")
    statuses = [client.get("/v1/documents", headers=bearer(busy)).status_code for _ in range(4)]
    assert statuses == [200] * 4
    refused = client.get("/v1/documents", headers=bearer(busy))
    assert refused.status_code == 429
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert refused.json()["title"] == "too many requests" and "RAGSVC_RATE_LIMIT 4/minute" in refused.json()["detail"]
    assert client.get("/v1/documents", headers=bearer(quiet)).status_code == 200
    # /mcp counts against the same key, and refuses the same way (its body a JSON-RPC error).
    mcp = client.post("/mcp", headers={**bearer(busy), "Accept": "application/json, text/event-stream"},
                      json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert mcp.status_code == 429 and "Retry-After" in mcp.headers
    assert "RAGSVC_RATE_LIMIT" in mcp.json()["error"]["message"]
    # Probes stay outside the limit.
    assert all(client.get("/healthz").status_code == 200 for _ in range(6))


def test_uploads_beyond_the_queue_depth_or_the_size_limits_are_refused_with_what_to_do(
        client: TestClient, url: str) -> None:
    ingester = bearer(create_key(url, "ingester"))

    def upload(*names: str) -> httpx.Response:
        return client.post("/v1/documents", headers=ingester, json=[
            {"source_uri": n, "text": "Tides rise twice a day.", "collection": "kb"} for n in names])

    too_many = upload("a.md", "b.md", "c.md")
    assert too_many.status_code == 413 and "RAGSVC_INGEST_MAX_FILES" in too_many.json()["detail"]
    big = client.post("/v1/documents", headers=ingester, json={"source_uri": "big.md", "text": "x" * 3000,
                                                                "collection": "kb"})
    assert big.status_code == 413 and "RAGSVC_INGEST_MAX_REQUEST_BYTES" in big.json()["detail"]
    assert upload("a.md").status_code == 202  # the one job the queue may hold (no worker takes it)
    full = upload("b.md")
    assert full.status_code == 503 and full.headers["Retry-After"] == "30"
    assert "RAGSVC_MAX_QUEUED_JOBS" in full.json()["detail"]


def test_health_queues_shows_the_queues_and_the_bounds_to_monitors_only(client: TestClient, url: str) -> None:
    monitor = bearer(create_key(url, "monitor"))
    body = client.get("/v1/health/queues", headers=monitor).json()
    assert body["ingestion"]["queued_limit"] == 1 and set(body["ingestion"]["by_status"]) >= {"queued", "running"}
    assert body["queries"] == {"in_flight": 0, "limit": 64, "refused": 0, "rate_limit": "4/minute"}
    assert "pending" in body["reviews"]["by_status"]
    assert client.get("/v1/health/queues", headers=bearer(create_key(url, "reader"))).status_code == 403


async def test_one_query_over_the_in_flight_bound_is_refused_at_once_until_one_finishes() -> None:
    release = asyncio.Event()

    async def held(scope, receive, send) -> None:  # noqa: ANN001 - an ASGI app standing in for the routes
        if scope["path"] == "/v1/query":  # a query is held until released; anything else answers at once
            await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    state = InFlight(limit=2)
    app = InFlightBound(held, state)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        running = [asyncio.create_task(http.post("/v1/query")) for _ in range(2)]
        for _ in range(500):
            if state.current == 2:
                break
            await asyncio.sleep(0.01)
        assert state.current == 2
        refused = await http.post("/v1/query")
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
        assert "RAGSVC_MAX_INFLIGHT_QUERIES" in refused.json()["detail"]
        assert (await http.get("/healthz")).status_code == 200  # other paths are not counted (nor held)
        release.set()
        assert [r.status_code for r in await asyncio.gather(*running)] == [200, 200]
        assert state.current == 0 and state.refused == 1
        assert (await http.post("/v1/query")).status_code == 200
