"""The evaluation loop end to end over HTTP with keys: a weak answer reaches the review queue by
itself, a reviewer claims and edits it, the golden item exists and the statistics count the
decision; and hold mode keeps a weak answer from its caller until a reviewer decides."""

from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from rag_service.api import create_app
from rag_service.config import load_settings
from rag_service.db.engine import Database
from rag_service.db.repos.keys import ApiKeyRepository
from tests.dbrun import run_on
from tests.fake_openai import fake_openai
from tests.langfuse_fake import SECRET_KEY, fake_langfuse
from tests.test_api_query import _ingest

WRONG = json.dumps({"reasoning_steps": ["[1] states the new limit"], "confidence": 0.9, "citations": [1],
                    "answer": "The on-call engineer raised max_connections from 100 to 900 and the service "
                              "recovered after 3 hours [1]."})
RIGHT = json.dumps({"reasoning_steps": ["[1] gives the rise time"], "confidence": 0.9, "citations": [1],
                    "answer": "Knead the dough for ten minutes, then let it rise for about an hour until it "
                              "doubles [1]."})


def _keys(url: str) -> dict[str, str]:
    async def make(db: Database) -> dict[str, str]:
        repo = ApiKeyRepository(db)
        return {role: (await repo.create(role, name=f"test-{role}"))[1] for role in ("reader", "reviewer")}

    return run_on(url, make)


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def llm_server():
    with fake_openai() as server:
        yield server


def _app(url: str, llm_url: str, **settings: object) -> TestClient:
    return TestClient(create_app(load_settings(
        database_url=url, serve_worker="on", worker_heartbeat_s=1, llm_base_url=llm_url, llm_api_key="k",
        llm_timeout_s=2, adaptive_retrieval=False, **{"eval_llm_judge": False, "eval_ragas": False, **settings})))


def test_a_weak_answer_is_queued_claimed_edited_and_counted(databases, llm_server) -> None:
    url = databases.create()
    with _app(url, llm_server.url) as client:
        _ingest(client, "kb")  # no key yet: the loopback local admin ingests
        keys = _keys(url)
        reader, reviewer = _bearer(keys["reader"]), _bearer(keys["reviewer"])

        llm_server.queue(RIGHT)
        good = client.post("/v1/query", headers=reader, json={"question": "How long should the dough rise?",
                                                              "collection": "kb"}).json()
        assert good["evaluation"]["needs_review"] is False and good["review_id"] is None

        llm_server.queue(WRONG)
        weak = client.post("/v1/query", headers=reader, json={"question": "What was max_connections raised to?",
                                                              "collection": "kb"}).json()
        grades = weak["evaluation"]
        assert weak["outcome"] == "answered" and grades["needs_review"] is True, grades
        assert grades["metrics"]["faithfulness"]["value"] < 0.8 and grades["overall"] < 0.8
        assert any(r.startswith("overall: ") for r in grades["reasons"])
        assert any(r.startswith("correctness: ") for r in grades["reasons"])

        # Nobody added it: the evaluator queued it.
        assert client.get("/v1/reviews", headers=reader).status_code == 403
        queue = client.get("/v1/reviews", headers=reviewer).json()
        assert queue["count"] == 1 and queue["data"][0]["id"] == str(weak["review_id"])
        item = client.get(f"/v1/reviews/{weak['review_id']}", headers=reviewer).json()
        assert "900" in item["answer"]["text"] if isinstance(item["answer"], dict) else "900" in item["answer"]

        claim = client.post(f"/v1/reviews/{weak['review_id']}/claim", headers=reviewer)
        assert claim.status_code == 200, claim.text
        corrected = "The on-call engineer raised max_connections from 100 to 300 [1]."
        decision = client.post(f"/v1/reviews/{weak['review_id']}/decision", headers=reviewer, json={
            "decision": "edited", "category": "answer_quality", "feedback": "wrong limit",
            "corrected_answer": corrected})
        assert decision.status_code == 201, decision.text

        async def golden(db: Database) -> list:
            async with db.connect() as conn:
                return (await conn.execute(text("SELECT question, answer, source FROM golden_items"))).all()

        rows = run_on(url, golden)
        assert [(r.answer, r.source) for r in rows] == [(corrected, "edited")]
        assert "max_connections" in rows[0].question

        stats = client.get("/v1/reviews/stats", headers=reviewer).json()
        assert stats["decisions_by_category"]["answer_quality"]["edited"] == 1
        assert stats["agreement"]["faithfulness"]["n"] == 1 and stats["agreement"]["faithfulness"]["corrected"] == 1


def test_hold_mode_keeps_a_weak_answer_until_a_reviewer_decides(databases, llm_server) -> None:
    url = databases.create()
    with _app(url, llm_server.url, review_gate="hold") as client:
        _ingest(client, "kb")
        llm_server.queue(WRONG)
        events = []
        raw = []
        with client.stream("POST", "/v1/query/stream", json={"question": "What was max_connections raised to?",
                                                             "collection": "kb"}) as response:
            for line in response.iter_lines():
                raw.append(line)
                if line.startswith("event:"):
                    events.append(line.split(":", 1)[1].strip())
                elif line.startswith("data:") and events[-1] == "done":
                    held = json.loads(line.split(":", 1)[1])
        assert "token" not in events and "citation" not in events  # nothing of the held answer leaks
        assert held["outcome"] == "pending_review" and held["review_id"] and held["citations"] == []
        assert "900" not in held["answer"] and "/v1/answers/" in held["answer"]
        assert "to 900" not in "\n".join(raw)  # not in tokens, citations, the grades' reasons: nowhere
        assert held["evaluation"]["overall"] < 0.8 and held["evaluation"]["reasons"] == ["held for review"]

        view = client.get(f"/v1/answers/{held['query_id']}").json()
        assert view["status"] == "pending_review"
        client.post(f"/v1/reviews/{held['review_id']}/claim")
        client.post(f"/v1/reviews/{held['review_id']}/decision", json={
            "decision": "edited", "category": "answer_quality",
            "corrected_answer": "It was raised from 100 to 300 [1]."})
        view = client.get(f"/v1/answers/{held['query_id']}").json()
        assert view["status"] == "reviewed" and "300" in json.dumps(view)

        llm_server.queue(RIGHT)
        good = client.post("/v1/query", json={"question": "How long should the dough rise?",
                                              "collection": "kb"}).json()
        assert good["outcome"] == "answered" and "hour" in good["answer"]


def _judge(value: float) -> str:
    return json.dumps({"reasoning_steps": ["checked each claim"], "scores": {
        m: {"value": value, "reason": f"the judge gives {value}."}
        for m in ("faithfulness", "relevance", "correctness", "coverage", "consistency")}})


def test_the_llm_judge_grades_after_delivery_and_can_queue_the_answer(databases, llm_server) -> None:
    url = databases.create()
    llm_server.reset()
    with fake_langfuse(public_key="pk-lf-late-grades") as langfuse, _app(
            url, llm_server.url, eval_llm_judge=True, langfuse_public_key=langfuse.public_key,
            langfuse_secret_key=SECRET_KEY, langfuse_host=langfuse.url) as client:
        _ingest(client, "kb")
        llm_server.on("You grade one answer", _judge(0.1))
        llm_server.queue(RIGHT)
        result = client.post("/v1/query", json={"question": "How long should the dough rise?",
                                                "collection": "kb"}).json()
        # Delivered on the local grades; the judge runs afterwards.
        assert result["evaluation"]["needs_review"] is False
        assert result["evaluation"]["metrics"]["faithfulness"]["scorer"] == "local-v1"

        async def rows(db: Database) -> tuple[list, list]:
            async with db.connect() as conn:
                scores = (await conn.execute(text("SELECT scorer, metrics, overall FROM answer_scores "
                                                  "WHERE query_id = :q"), {"q": result["query_id"]})).all()
                items = (await conn.execute(text("SELECT trigger, reasons FROM review_items WHERE query_id = :q"),
                                            {"q": result["query_id"]})).all()
            return scores, items

        deadline = time.monotonic() + 30
        while len((found := run_on(url, rows))[0]) < 2:
            assert time.monotonic() < deadline, found
            time.sleep(0.2)
        scores, items = found
        combined = next(r for r in scores if r.scorer == "combined")
        assert combined.metrics["faithfulness"]["scorer"].startswith("llm-judge:")
        assert combined.metrics["faithfulness"]["value"] == 0.1
        assert combined.metrics["traceability"]["scorer"] == "local-v1"  # the judge does not grade it
        assert combined.overall < 0.8 and items and items[0].trigger == "evaluator"
        view = client.get(f"/v1/answers/{result['query_id']}").json()
        assert view["status"] == "answered"
        # The late grades replace the delivered ones in the stored trace and, by score id, in Langfuse.
        deadline = time.monotonic() + 30
        while not (trace := client.get(f"/v1/queries/{result['query_id']}/trace").json())[
                "evaluation"]["metrics"]["faithfulness"]["scorer"].startswith("llm-judge:"):
            assert time.monotonic() < deadline, trace["evaluation"]
            time.sleep(0.2)
        assert trace["evaluation"]["overall"] == pytest.approx(combined.overall)
        assert client.app.state.runtime.tracer.flush(30)
        trace_id = result["query_id"].replace("-", "")
        scores = {s["name"]: s for s in langfuse.scores.values() if s["traceId"] == trace_id}
        assert scores["faithfulness"]["value"] == 0.1 and scores["faithfulness"]["comment"].startswith("llm-judge:")
        assert scores["traceability"]["comment"].startswith("local-v1:")


def test_an_invalid_judge_reply_keeps_the_local_grades_with_the_reason(databases, llm_server) -> None:
    url = databases.create()
    llm_server.reset()
    with _app(url, llm_server.url, eval_llm_judge=True, review_gate="hold") as client:
        _ingest(client, "kb")
        llm_server.on("You grade one answer", "I think it is fine.")
        llm_server.queue(RIGHT)
        result = client.post("/v1/query", json={"question": "How long should the dough rise?",
                                                "collection": "kb"}).json()
        faithfulness = result["evaluation"]["metrics"]["faithfulness"]
        assert faithfulness["scorer"] == "local-v1" and "llm judge reply invalid" in faithfulness["reason"]
        assert result["outcome"] == "answered"
