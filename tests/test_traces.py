"""Stored query traces over HTTP (real PostgreSQL, the local model): what a trace holds, who may read
it, and its retention."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, text

from rag_service.config import load_settings
from rag_service.db.engine import Database
from rag_service.db.repos.traces import TraceRepository
from tests.apps import client_with_documents
from tests.test_auth import bearer, create_key


@pytest.fixture(scope="module")
def client(migrated_url: str) -> Iterator[TestClient]:
    yield from client_with_documents(migrated_url)


def test_a_query_leaves_a_trace_with_steps_route_ranks_and_evaluation(client: TestClient) -> None:
    answer = client.post("/v1/query", json={"question": "What raises the ocean tides twice a day?",
                                            "collection": "kb"}).json()
    trace = client.get(f"/v1/queries/{answer['query_id']}/trace")
    assert trace.status_code == 200, trace.text
    body = trace.json()
    assert body["query_id"] == answer["query_id"] and body["outcome"] == answer["outcome"]
    assert [s["id"] for s in body["steps"]] == [s["id"] for s in answer["steps"]]
    assert body["timings_ms"]["total"] > 0 and body["route"]["guideline"] == answer["route"]["guideline"]
    assert body["candidates"] and body["candidates"][0]["source_uri"] == "tides.md"
    assert body["candidates"][0]["ranks"] and set(body["candidates"][0]["ranks"]) <= {"semantic", "keyword",
                                                                                      "pattern", "metadata"}
    assert answer["evaluation"] is not None, answer["outcome"]
    assert body["evaluation"]["overall"] == answer["evaluation"]["overall"]
    assert body["errors"] == [] and "api_key_id" not in body
    assert client.get("/v1/queries/00000000-0000-0000-0000-000000000000/trace").status_code == 404
    # Whatever the outcome, the question is stored masked.
    personal = client.post("/v1/query", json={"question": "jane@example.com asks: why are there tides?",
                                              "collection": "kb"}).json()
    masked = client.get(f"/v1/queries/{personal['query_id']}/trace")
    assert "jane@example.com" not in masked.text and "[EMAIL]" in masked.json()["question"]  # parts included


def test_a_reader_sees_its_own_traces_and_a_reviewer_all(client: TestClient, migrated_url: str) -> None:
    mine, other = create_key(migrated_url, "reader", name="mine"), create_key(migrated_url, "reader", name="other")
    reviewer = create_key(migrated_url, "reviewer")
    answer = client.post("/v1/query", json={"question": "How long should dough rise?", "collection": "kb"},
                         headers=bearer(mine)).json()
    path = f"/v1/queries/{answer['query_id']}/trace"
    assert client.get(path, headers=bearer(mine)).status_code == 200
    assert client.get(path, headers=bearer(other)).status_code == 404
    assert client.get(path, headers=bearer(reviewer)).status_code == 200
    # Keys that may not see the documents the query could: another collection, fewer principals.
    elsewhere = create_key(migrated_url, "reviewer", collections=["other"])
    narrower = create_key(migrated_url, "reviewer", principals=["nobody"])
    lawyer = create_key(migrated_url, "reader", principals=["legal"])
    legal = client.post("/v1/query", json={"question": "How long should dough rise?", "collection": "kb"},
                        headers=bearer(lawyer))
    assert client.get(f"/v1/queries/{legal.json()['query_id']}/trace", headers=bearer(lawyer)).status_code == 200
    assert client.get(path, headers=bearer(elsewhere)).status_code == 404
    assert client.get(f"/v1/queries/{legal.json()['query_id']}/trace", headers=bearer(narrower)).status_code == 404


async def test_traces_past_retention_are_deleted(client: TestClient, migrated_url: str) -> None:
    db = Database.from_settings(load_settings(database_url=migrated_url))
    try:
        traces = TraceRepository(db)
        assert await traces.delete_older_than(30) == 0  # all are new
        assert await traces.delete_older_than(0) >= 2
    finally:
        await db.engine.dispose()
    assert client.get("/v1/queries/00000000-0000-0000-0000-000000000000/trace").status_code in (401, 404)


def test_a_trace_read_right_after_its_answer_waits_for_the_write(client: TestClient,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # The trace is written after the answer has gone; a slow write must still be read, not 404.
    write_s = 1.0
    slow = TraceRepository.record_trace

    async def record_slowly(self: TraceRepository, trace: object) -> None:
        await asyncio.sleep(write_s)
        await slow(self, trace)  # type: ignore[arg-type]

    monkeypatch.setattr(TraceRepository, "record_trace", record_slowly)
    started = time.perf_counter()
    answer = client.post("/v1/query", json={"question": "What raises the ocean tides twice a day?",
                                            "collection": "kb"}).json()
    assert time.perf_counter() - started < write_s  # the answer did not wait for its trace
    trace = client.get(f"/v1/queries/{answer['query_id']}/trace")
    assert trace.status_code == 200, trace.text
    assert trace.json()["query_id"] == answer["query_id"]
    assert time.perf_counter() - started >= write_s  # the read did


async def test_trace_writes_commit_without_waiting_for_the_disk(client: TestClient, migrated_url: str) -> None:
    # Best effort, after the answer: the commit of a trace (and of its late grades) does not wait
    # for the WAL flush, which the next answer would otherwise queue behind.
    answer = client.post("/v1/query", json={"question": "How long should dough rise?", "collection": "kb"}).json()
    assert client.get(f"/v1/queries/{answer['query_id']}/trace").status_code == 200  # waits for the write
    db = Database.from_settings(load_settings(database_url=migrated_url))
    seen: list[tuple[str, str]] = []

    def setting_at_write(conn, cursor, statement, parameters, context, executemany) -> None:  # noqa: ANN001
        if statement.startswith(("INSERT INTO query_traces", "UPDATE query_traces")):
            probe = conn.connection.dbapi_connection.cursor()
            probe.execute("SHOW synchronous_commit")
            seen.append((statement.split()[0], probe.fetchone()[0]))

    try:
        async with db.connect() as conn:
            default = (await conn.execute(text("SHOW synchronous_commit"))).scalar_one()
        assert default != "off"  # else this test shows nothing
        event.listen(db.engine.sync_engine, "after_cursor_execute", setting_at_write)
        traces = TraceRepository(db)
        trace = await traces.get(uuid.UUID(answer["query_id"]))
        await traces.record_trace(trace.model_copy(update={"query_id": uuid.uuid4()}))
        assert trace.evaluation is not None
        await traces.record_evaluation(trace.query_id, trace.evaluation)
        async with db.connect() as conn:  # other transactions keep the server's default
            assert (await conn.execute(text("SHOW synchronous_commit"))).scalar_one() == default
    finally:
        await db.engine.dispose()
    assert seen == [("INSERT", "off"), ("UPDATE", "off")]
