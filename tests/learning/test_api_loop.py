"""The learning loop over HTTP on a small real corpus, with API keys: admins write versions, labels
and experiments, reviewers read; the real query pipeline answers with the version production or
the experiment chooses, records it on the answer, and a promotion changes what the next query uses."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from rag_service.api import create_app
from rag_service.config import load_settings
from rag_service.domain import ROLES
from tests.dbrun import run_on
from tests.test_api_query import DOCS
from tests.test_auth import bearer, create_key

QUESTION = "What does the ef_search parameter trade off in HNSW?"


@pytest.fixture(scope="module")
def keys(migrated_url: str) -> dict[str, str]:
    return {role: create_key(migrated_url, role, name=f"{role}-key") for role in ROLES}


@pytest.fixture(scope="module")
def client(migrated_url: str, keys: dict[str, str]):
    settings = load_settings(database_url=migrated_url, serve_worker="on", worker_heartbeat_s=1)
    with TestClient(create_app(settings)) as test_client:
        admin = bearer(keys["admin"])
        accepted = test_client.post("/v1/documents", headers=admin, json=[
            {"source_uri": uri, "title": title, "text": body, "collection": "kb"} for uri, title, body in DOCS])
        assert accepted.status_code == 202, accepted.text
        deadline = time.monotonic() + 120
        while (job := test_client.get(accepted.json()["status_url"], headers=admin).json())["status"] not in (
                "succeeded", "failed"):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert job["status"] == "succeeded", job
        yield test_client


def _answers(url: str) -> list[tuple]:
    async def read(db) -> list[tuple]:  # noqa: ANN001
        async with db.connect() as conn:
            return [tuple(r) for r in (await conn.execute(text(
                "SELECT a.prompt_name, a.prompt_version, a.experiment_id, a.variant, q.conversation_id, "
                "CAST(a.timings_ms ->> 'total' AS float8) FROM answers a JOIN queries q ON q.id = a.query_id "
                "ORDER BY a.created_at"))).all()]

    return run_on(url, read)


def test_roles_guard_the_routes_and_bad_input_says_what_to_fix(client: TestClient, keys: dict[str, str]) -> None:
    reader, reviewer, admin = bearer(keys["reader"]), bearer(keys["reviewer"]), bearer(keys["admin"])
    assert client.get("/v1/prompts", headers=reader).status_code == 403
    listed = client.get("/v1/prompts", headers=reviewer)
    assert listed.status_code == 200 and {"answer_extractive", "router"} <= {p["name"] for p in listed.json()}
    body = {"parameters": {"max_sentences": 1}, "label": "candidate"}
    assert client.post("/v1/prompts/answer_extractive/versions", headers=reviewer, json=body).status_code == 403
    bad = client.post("/v1/prompts/answer_cot/versions", headers=admin, json={"body": "[system]\n{{ oops"})
    assert bad.status_code == 422 and "Jinja2" in bad.json()["detail"]
    assert client.post("/v1/prompts/answer_cot/versions", headers=admin,
                       json={"label": "Not A Label"}).status_code == 422
    assert client.get("/v1/prompts/nope/versions", headers=reviewer).status_code == 404
    assert client.put("/v1/guidelines/labels/production", headers=admin, json={"version": 99}).status_code == 404
    assert client.post("/v1/experiments", headers=admin, json={"name": "answer_extractive", "share": 1.5}
                       ).status_code == 422
    guidelines = client.get("/v1/guidelines/versions", headers=reviewer).json()
    assert guidelines["count"] == 1 and guidelines["data"][0]["labels"] == ["production"]


def test_queries_use_production_then_the_experiment_then_the_promoted_version(
        client: TestClient, keys: dict[str, str], migrated_url: str) -> None:
    admin, reader = bearer(keys["admin"]), bearer(keys["reader"])
    before = client.post("/v1/query", headers=reader, json={"collection": "kb", "question": QUESTION}).json()
    assert before["prompt"]["name"] == "answer_extractive" and before["prompt"]["version"] == 1
    created = client.post("/v1/prompts/answer_extractive/versions", headers=admin,
                          json={"parameters": {"max_sentences": 1, "support_ratio": 0.0}, "label": "candidate",
                                "note": "one sentence per answer"})
    assert created.status_code == 201, created.text
    assert created.json()["version"] == 2 and created.json()["parameters"]["max_sentences"] == 1
    diff = client.get("/v1/prompts/answer_extractive/diff?from=1&to=2", headers=admin).json()
    assert diff["parameters_changed"]["max_sentences"] == [3, 1]
    started = client.post("/v1/experiments", headers=admin, json={"name": "answer_extractive", "share": 0.5})
    assert started.status_code == 201, started.text
    experiment_id = started.json()["id"]

    variants: dict[str, set[str]] = {}
    for i in range(12):
        for _ in range(2):  # the same conversation twice: the same variant
            result = client.post("/v1/query", headers=reader, json={
                "collection": "kb", "question": QUESTION, "conversation_id": f"conv-{i}"}).json()
            assert result["outcome"] == "answered", result
            variants.setdefault(f"conv-{i}", set()).add(result["prompt"]["variant"])
            if result["prompt"]["variant"] == "candidate":
                assert result["prompt"]["version"] == 2 and len(result["claims"]) == 1
    assert all(len(v) == 1 for v in variants.values())
    assert {v for (v,) in variants.values()} == {"control", "candidate"}
    logged = [row for row in _answers(migrated_url) if row[4] is not None]
    assert len(logged) == 24 and {str(row[2]) for row in logged} == {experiment_id}
    assert all(row[5] is not None and row[5] > 0 for row in logged)  # latency is stored for the report
    report = client.get(f"/v1/experiments/{experiment_id}", headers=bearer(keys["reviewer"])).json()
    assert sum(v["answers"] for v in report["variants"]) == 24 and report["decision"] == "undecided"

    refused = client.post(f"/v1/experiments/{experiment_id}/promote", headers=admin, json={})
    assert refused.status_code == 409 and "has not won" in refused.json()["detail"]
    forced = client.post(f"/v1/experiments/{experiment_id}/promote", headers=admin,
                         json={"force": True, "reason": "smoke test"})
    assert forced.status_code == 200, forced.text
    assert forced.json()["move"]["forced"] and forced.json()["move"]["to_version"] == 2
    after = client.post("/v1/query", headers=reader, json={"collection": "kb", "question": QUESTION}).json()
    assert after["prompt"]["version"] == 2 and "variant" not in after["prompt"] and len(after["claims"]) == 1
    labels = client.get("/v1/prompts/answer_extractive/labels", headers=admin).json()
    assert labels["labels"] == {"candidate": 2, "production": 2}
    assert labels["moves"][0]["actor"].startswith("admin-key") and labels["moves"][0]["forced"]
    rolled = client.post("/v1/prompts/answer_extractive/rollback", headers=admin, json={})
    assert rolled.status_code == 200 and rolled.json()["move"]["to_version"] == 1
    last = client.post("/v1/query", headers=reader, json={"collection": "kb", "question": QUESTION}).json()
    assert last["prompt"]["version"] == 1
