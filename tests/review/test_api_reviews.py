"""The review and answer routes over HTTP (as the local operator: no keys exist in this module's
database): status codes, problem bodies, validation, and held answers before and after review."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from rag_service.api import create_app
from rag_service.config import load_settings
from rag_service.db.engine import Database
from rag_service.db.repos.reviews import ReviewRepository
from rag_service.review.answers import REJECTED_ANSWER
from tests.review.conftest import DbRun
from tests.review.seed import backdate, citation, seed

ALICE = uuid.uuid4()


@pytest.fixture(scope="module")
def client(migrated_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(load_settings(database_url=migrated_url))) as test_client:
        yield test_client


def fresh() -> str:
    return f"api-{uuid.uuid4().hex[:10]}"


def problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status
    return body


def test_list_filters_and_pages(client: TestClient, db_run: DbRun) -> None:
    collection = fresh()
    _, high = seed(db_run, collection=collection, tier="high", overall=0.3, flagged=["faithfulness"],
                   reasons=["faithfulness: 0.30 < 0.80"])
    _, normal = seed(db_run, collection=collection, overall=0.7)
    response = client.get("/v1/reviews", params={"collection": collection})
    assert response.status_code == 200
    page = response.json()
    assert page["count"] == 2 and [i["id"] for i in page["data"]] == [str(high), str(normal)]
    first = page["data"][0]
    assert first["tier"] == "high" and first["metrics"] == ["faithfulness"] and first["question"]
    assert 0 < first["priority"] <= 1 and first["status"] == "pending"
    only = client.get("/v1/reviews", params={"collection": collection, "metric": "faithfulness"}).json()
    assert [i["id"] for i in only["data"]] == [str(high)]
    assert client.get("/v1/reviews", params={"collection": collection, "reason": "FAITHFUL"}).json()["count"] == 1
    second = client.get("/v1/reviews", params={"collection": collection, "limit": 1, "offset": 1}).json()
    assert second["count"] == 2 and [i["id"] for i in second["data"]] == [str(normal)]


@pytest.mark.parametrize("params", [{"status": "lost"}, {"metric": "vibes"}, {"limit": 0}, {"limit": 500},
                                    {"offset": -1}, {"prompt_version": 0}])
def test_list_validates_its_filters(client: TestClient, params: dict[str, Any]) -> None:
    body = problem(client.get("/v1/reviews", params=params), 422)
    assert body["title"] == "invalid input" and list(params)[0] in body["detail"][0]["field"]


def test_get_shows_the_item_and_404s_an_unknown_one(client: TestClient, db_run: DbRun) -> None:
    cited = [citation(1, uuid.uuid4(), uuid.uuid4())]
    _, review_id = seed(db_run, collection=fresh(), citations=cited)
    item = client.get(f"/v1/reviews/{review_id}").json()
    assert item["id"] == str(review_id) and item["answer"]["text"].startswith("Reset it")
    assert item["citations"][0]["quote"] == cited[0]["quote"] and item["scores"][0]["scorer"] == "local-v1"
    assert item["route"]["guideline"] == "default-answer" and item["decision"] is None
    missing = uuid.uuid4()
    body = problem(client.get(f"/v1/reviews/{missing}"), 404)
    assert str(missing) in body["detail"]
    problem(client.get("/v1/reviews/not-a-uuid"), 422)


def test_claim_and_its_conflicts(client: TestClient, db_run: DbRun) -> None:
    _, review_id = seed(db_run, collection=fresh())
    claim = client.post(f"/v1/reviews/{review_id}/claim")
    assert claim.status_code == 200 and claim.json()["claimed_by"] is None  # the local operator
    again = client.post(f"/v1/reviews/{review_id}/claim").json()
    assert again["lease_expires_at"] >= claim.json()["lease_expires_at"]
    problem(client.post(f"/v1/reviews/{uuid.uuid4()}/claim"), 404)

    _, taken = seed(db_run, collection=fresh())
    lease = db_run(lambda db: ReviewRepository(db).claim(taken, ALICE, 600))
    body = problem(client.post(f"/v1/reviews/{taken}/claim"), 409)
    assert body["claimed_by"] == str(ALICE) and body["lease_expires_at"] == lease.lease_expires_at.isoformat()
    assert str(ALICE) in body["detail"] and "until" in body["detail"]


def test_a_decision_needs_a_claim_and_a_valid_body(client: TestClient, db_run: DbRun) -> None:
    _, review_id = seed(db_run, collection=fresh())
    approve = {"decision": "approved", "category": "answer_quality"}
    body = problem(client.post(f"/v1/reviews/{review_id}/decision", json=approve), 409)
    assert "claim" in body["detail"]
    client.post(f"/v1/reviews/{review_id}/claim")
    for invalid in ({"decision": "edited", "category": "other"}, {"decision": "maybe", "category": "other"},
                    {"decision": "approved", "category": "vibes"}, {**approve, "surprise": 1},
                    {**approve, "time_to_review_s": -1}):
        problem(client.post(f"/v1/reviews/{review_id}/decision", json=invalid), 422)
    edited = {"decision": "edited", "category": "relevance", "corrected_answer": "Use the reset link.",
              "feedback": "too vague", "corrected_routing": {"guideline": "exact-lookup"}}
    decided = client.post(f"/v1/reviews/{review_id}/decision", json=edited)
    assert decided.status_code == 201, decided.text
    result = decided.json()
    assert result["decision"] == "edited" and result["golden_item_id"] and result["reviewer_key_id"] is None
    assert client.get(f"/v1/reviews/{review_id}").json()["decision"]["corrected_answer"] == "Use the reset link."
    problem(client.post(f"/v1/reviews/{review_id}/decision", json=approve), 409)
    problem(client.post(f"/v1/reviews/{uuid.uuid4()}/decision", json=approve), 404)


def test_stats(client: TestClient, db_run: DbRun) -> None:
    seed(db_run, collection=fresh())
    response = client.get("/v1/reviews/stats")
    assert response.status_code == 200
    stats = response.json()
    assert stats["by_status"]["pending"] >= 1 and stats["open_age_s"]["p95"] >= stats["open_age_s"]["p50"]
    assert set(stats["agreement"]) == {"faithfulness", "relevance", "correctness", "coverage", "consistency",
                                       "freshness", "traceability"}


def test_a_delivered_answer_reads_as_answered(client: TestClient, db_run: DbRun) -> None:
    cited = [citation(1, uuid.uuid4(), uuid.uuid4())]
    answer_id, _ = seed(db_run, collection=fresh(), queue=False, overall=0.9, citations=cited)
    view = client.get(f"/v1/answers/{answer_id}").json()
    assert view["status"] == "answered" and view["answer"].startswith("Reset it") and view["review_id"] is None
    assert view["citations"][0]["quote"] == cited[0]["quote"] and view["scores"][0]["overall"] == 0.9
    problem(client.get(f"/v1/answers/{uuid.uuid4()}"), 404)


@pytest.mark.parametrize(("decision", "status", "answer"), [
    ({"decision": "approved", "category": "answer_quality"}, "reviewed", "Reset it from the settings page [1]."),
    ({"decision": "edited", "category": "answer_quality", "corrected_answer": "Use the link."}, "reviewed",
     "Use the link."),
    ({"decision": "rejected", "category": "relevance"}, "rejected", REJECTED_ANSWER),
])
def test_a_held_answer_waits_for_its_review(client: TestClient, db_run: DbRun, decision: dict[str, Any],
                                            status: str, answer: str) -> None:
    answer_id, review_id = seed(db_run, collection=fresh(), held=True, tier="high", overall=0.4)

    async def check_held(db: Database) -> bool:
        async with db.connect() as conn:
            return (await conn.execute(text("SELECT held FROM answers WHERE query_id = :q"),
                                       {"q": answer_id})).scalar_one()

    assert db_run(check_held) is True
    before = client.get(f"/v1/answers/{answer_id}").json()
    assert before["status"] == "pending_review" and before["answer"] is None and before["citations"] == []
    assert before["review_id"] == str(review_id) and before["scores"] == []
    client.post(f"/v1/reviews/{review_id}/claim")
    assert client.get(f"/v1/answers/{answer_id}").json()["status"] == "pending_review"
    assert client.post(f"/v1/reviews/{review_id}/decision", json=decision).status_code == 201
    after = client.get(f"/v1/answers/{answer_id}").json()
    assert after["status"] == status and after["answer"] == answer and after["review_status"] == decision["decision"]


def test_a_held_answer_nobody_reviewed_expires(client: TestClient, db_run: DbRun) -> None:
    collection = fresh()
    answer_id, review_id = seed(db_run, collection=collection, held=True)
    db_run(lambda db: backdate(db, review_id, 40 * 86_400))
    assert client.get("/v1/reviews", params={"collection": collection}).json()["data"][0]["status"] == "expired"
    view = client.get(f"/v1/answers/{answer_id}").json()
    assert view["status"] == "expired" and view["answer"] is None and "no reviewer" in view["message"]


def test_feedback(client: TestClient, db_run: DbRun) -> None:
    collection = fresh()
    answer_id, _ = seed(db_run, collection=collection, queue=False, overall=0.95)
    kept = client.post(f"/v1/answers/{answer_id}/feedback", json={"rating": 5})
    assert kept.status_code == 201 and kept.json()["review_id"] is None
    low = client.post(f"/v1/answers/{answer_id}/feedback", json={"rating": 1, "comment": "wrong year"}).json()
    assert low["review_id"] and low["rating"] == 1 and low["feedback_id"] > kept.json()["feedback_id"]
    [item] = client.get("/v1/reviews", params={"collection": collection, "reason": "user feedback"}).json()["data"]
    assert item["id"] == low["review_id"] and item["tier"] == "high" and item["trigger"] == "feedback"
    assert item["reasons"] == ["user feedback: rating 1/5: wrong year"]
    for invalid in ({"rating": 0}, {"rating": 6}, {"rating": "bad"}, {}, {"rating": 3, "comment": "x" * 2001}):
        problem(client.post(f"/v1/answers/{answer_id}/feedback", json=invalid), 422)
    problem(client.post(f"/v1/answers/{uuid.uuid4()}/feedback", json={"rating": 1}), 404)


def test_the_routes_are_documented_with_their_roles(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    expected = {("/v1/reviews", "get"): "reviewer", ("/v1/reviews/stats", "get"): "reviewer",
                ("/v1/reviews/{review_id}", "get"): "reviewer", ("/v1/reviews/{review_id}/claim", "post"): "reviewer",
                ("/v1/reviews/{review_id}/decision", "post"): "reviewer", ("/v1/answers/{answer_id}", "get"): "reader",
                ("/v1/answers/{answer_id}/feedback", "post"): "reader"}
    for (path, method), role in expected.items():
        assert paths[path][method]["x-required-role"] == role
    decision = client.get("/openapi.json").json()["components"]["schemas"]["ReviewDecisionRequest"]
    assert "required for edited" in decision["properties"]["corrected_answer"]["description"]
