"""The query pipeline's LLM path over HTTP against a local OpenAI-compatible server: streamed
tokens, and the fallback to the extractive answer on timeouts, server errors, a trickling stream and
answers that fail validation."""

from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient

from rag_service.api import create_app
from rag_service.config import load_settings
from rag_service.pipeline.generation.extractive import ABSTAIN_BELOW
from tests.fake_openai import Reply, fake_openai
from tests.test_api_query import _events, _ingest


@pytest.fixture(scope="module")
def llm_server():
    with fake_openai() as server:
        yield server


@pytest.fixture(scope="module")
def llm_client(databases, llm_server):
    url = databases.create()
    # The generate budget bounds an LLM that answers but trickles (each piece within the read timeout).
    settings = load_settings(database_url=url, serve_worker="on", worker_heartbeat_s=1, llm_base_url=llm_server.url,
                             llm_api_key="k", llm_timeout_s=1.5, query_generate_budget_s=5, adaptive_retrieval=False,
                             eval_llm_judge=False, eval_ragas=False)
    with TestClient(create_app(settings)) as test_client:
        _ingest(test_client, "kb")
        yield test_client


def test_llm_answers_stream_tokens(llm_client: TestClient, llm_server) -> None:
    reply = json.dumps({"reasoning_steps": ["[1] gives the rise time"], "answer": "Let the dough rise for about an "
                        "hour until it doubles [1].", "citations": [1], "confidence": 0.8})
    llm_server.queue(reply)
    events = _events(llm_client, {"question": "How long should the dough rise?"})
    tokens = "".join(d["text"] for k, d in events if k == "token")
    done = events[-1][1]
    assert tokens == done["answer"] == "Let the dough rise for about an hour until it doubles [1]."
    assert done["generator"] == "llm" and done["prompt"] == {"name": "answer_cot", "version": 1}
    assert done["citations"][0]["source_uri"] == "bread.md" and done["citations"][0]["verified"]
    assert done["reasoning_steps"] == ["[1] gives the rise time"]
    # The stream's last chunk reports the tokens (the fake server counts four characters a token).
    assert done["llm_tokens"]["completion"] == len(reply) // 4 + 1 and done["llm_tokens"]["prompt"] > 100


def test_an_llm_that_finds_no_answer_in_the_passages_gives_outcome_no_answer(llm_client: TestClient,
                                                                             llm_server) -> None:
    statement = "The passages do not say who won the 2022 FIFA World Cup."
    reply = json.dumps({"reasoning_steps": ["The passages are about bread."], "answer": statement,
                        "citations": [], "confidence": 0.1})
    llm_server.queue(reply, reply)
    result = llm_client.post("/v1/query", json={"question": "Who won the 2022 FIFA World Cup?",
                                                "collection": "kb"}).json()
    assert result["outcome"] == "no_answer" and result["answer"] == statement and result["generator"] == "llm"
    assert result["short_answer"] is None
    assert result["citations"] == [] and result["evaluation"] is None and result["review_id"] is None
    assert result["closest_sources"] and all(not s["verified"] for s in result["closest_sources"])
    # Checked by the answerability models, which find nothing on it either: their probability is the confidence.
    assert result["answerability"]["probability"] < ABSTAIN_BELOW
    assert result["confidence"] == pytest.approx(result["answerability"]["probability"], abs=1e-3)
    events = _events(llm_client, {"question": "Who won the 2022 FIFA World Cup?"})
    assert "".join(d["text"] for k, d in events if k == "token") == statement
    assert events[-1][0] == "done" and events[-1][1]["outcome"] == "no_answer"


def test_an_uncited_llm_reply_the_evidence_answers_is_graded_not_an_abstention(llm_client: TestClient,
                                                                               llm_server) -> None:
    # The documents say how long the dough rises; a reply citing nothing is then an uncited answer.
    reply = json.dumps({"reasoning_steps": [], "answer": "About an hour.", "citations": [], "confidence": 0.7})
    llm_server.queue(reply)
    result = llm_client.post("/v1/query", json={"question": "How long should the dough rise?",
                                                "collection": "kb"}).json()
    assert result["outcome"] == "answered" and result["answer"] == "About an hour." and result["generator"] == "llm"
    assert result["closest_sources"] == [] and result["answerability"]["probability"] >= ABSTAIN_BELOW
    assert result["evaluation"]["metrics"]["traceability"]["value"] < 0.5 and result["evaluation"]["needs_review"]
    assert result["review_id"] is not None


def test_llm_timeout_falls_back_to_extractive(llm_client: TestClient, llm_server) -> None:
    llm_server.queue(Reply("{}", delay_s=3))
    result = llm_client.post("/v1/query", json={"question": "How long should the dough rise?",
                                                "collection": "kb"}).json()
    assert result["outcome"] == "answered" and result["generator"] == "extractive"
    assert "LLM generation failed" in result["fallback_reason"]
    assert next(s for s in result["steps"] if s["kind"] == "generate")["status"] == "fallback"
    assert result["citations"][0]["source_uri"] == "bread.md"


def test_llm_server_errors_fall_back_to_extractive_with_the_error_recorded(llm_client: TestClient,
                                                                           llm_server) -> None:
    llm_server.default = Reply(status=503)  # every try, retries included
    try:
        result = llm_client.post("/v1/query", json={"question": "How long should the dough rise?",
                                                    "collection": "kb"}).json()
    finally:
        llm_server.default = Reply("ok")
    assert result["outcome"] == "answered" and result["generator"] == "extractive"
    assert "503" in result["fallback_reason"], result["fallback_reason"]
    generate = next(s for s in result["steps"] if s["kind"] == "generate")
    assert generate["status"] == "fallback" and "503" in generate["detail"]
    assert result["citations"][0]["source_uri"] == "bread.md"
    stored = llm_client.get(f"/v1/queries/{result['query_id']}/trace").json()
    assert next(s for s in stored["steps"] if s["kind"] == "generate")["status"] == "fallback"


def test_a_trickling_llm_stream_falls_back_within_the_budget(llm_client: TestClient, llm_server) -> None:
    # A valid answer, but 4 characters every 0.4 s: each piece is within the 1.5 s read timeout, the
    # whole would take ~20 s; the 5 s generate budget ends it.
    answer = json.dumps({"answer": "Let the dough rise for about an hour [1].", "reasoning_steps": [],
                         "citations": [1], "confidence": 0.8})  # the answer first: its tokens are sent early
    llm_server.queue(Reply(answer, piece_delay_s=0.4))
    started = time.monotonic()
    events = _events(llm_client, {"question": "How long should the dough rise?"})
    assert time.monotonic() - started < 15
    done = events[-1][1]
    assert done["generator"] == "extractive" and "timed out" in done["fallback_reason"], done["fallback_reason"]
    assert next(s for s in done["steps"] if s["kind"] == "generate")["status"] == "fallback"
    kinds = [k for k, _ in events]
    assert "token.reset" in kinds  # the pieces already sent are withdrawn before the extractive answer
    assert done["citations"][0]["source_uri"] == "bread.md"


def test_streamed_tokens_are_reset_when_the_llm_answer_is_replaced(llm_client: TestClient, llm_server) -> None:
    invalid = '{"answer": "A half-written answer [1]"}'  # streams tokens, then fails validation (no confidence)
    llm_server.queue(invalid, invalid, invalid)
    events = _events(llm_client, {"question": "How long should the dough rise?"})
    kinds = [k for k, _ in events]
    assert "token.reset" in kinds
    reset = kinds.index("token.reset")
    before = "".join(d["text"] for k, d in events[:reset] if k == "token")
    after = "".join(d["text"] for k, d in events[reset:] if k == "token")
    assert before == "A half-written answer [1]"
    done = events[-1][1]
    assert done["generator"] == "extractive" and "3 tries" in done["fallback_reason"]
    assert after.strip().startswith(done["claims"][0]["text"][:20])
