"""Langfuse tracing against a local fake of Langfuse's API (OTLP spans and scores), with the real
pipeline, PostgreSQL and local model: the trace tree a query leaves, an LLM generation's tokens, cost
and prompt, ingestion jobs and eval runs, the bounded queue, and silence without keys."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from rag_service.config import load_settings
from rag_service.observability.trace_tree import Observation, TraceRecord
from rag_service.observability.tracing import LangfuseTracer
from tests.apps import client_with_documents
from tests.fake_openai import fake_openai
from tests.langfuse_fake import SECRET_KEY, FakeLangfuse, fake_langfuse
from tests.otlp_decode import json_attribute

TYPE = "langfuse.observation.type"


def unique_key() -> str:
    # The SDK keeps one client per public key for the life of the process: one key per fake.
    return f"pk-lf-{uuid.uuid4().hex[:12]}"


def langfuse_settings(fake: FakeLangfuse) -> dict[str, object]:
    return {"langfuse_public_key": fake.public_key, "langfuse_secret_key": SECRET_KEY, "langfuse_host": fake.url}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeLangfuse]:
    with fake_langfuse(public_key=unique_key()) as server:
        yield server


@pytest.fixture(scope="module")
def client(databases, fake: FakeLangfuse) -> Iterator[TestClient]:
    yield from client_with_documents(databases.create(), **langfuse_settings(fake))


def flushed(client: TestClient) -> None:
    """Langfuse has what was queued: the traces are queued after the answers have gone, so first
    wait for those tasks."""
    runtime = client.app.state.runtime
    client.portal.call(runtime.reporting.drain, 30)
    assert runtime.tracer.flush(30)


def trace_spans(fake: FakeLangfuse, trace_id: str) -> dict[str, dict]:
    spans = [s for s in fake.spans if s["trace_id"] == trace_id]
    by_name = {s["name"]: s for s in spans}
    assert len(by_name) == len(spans), [s["name"] for s in spans]  # names are unique within a query's trace
    return by_name


def test_a_query_leaves_a_trace_tree_with_steps_events_and_scores(client: TestClient, fake: FakeLangfuse) -> None:
    answer = client.post("/v1/query", json={"question": "jane@example.com asks: what raises the ocean tides?",
                                            "collection": "kb"}).json()
    assert answer["outcome"] == "answered", answer
    flushed(client)
    spans = trace_spans(fake, uuid.UUID(answer["query_id"]).hex)  # the trace id is the query id

    # The root: the whole query, the masked question in, the answer out, the trace's own attributes.
    root = spans["query"]
    assert root["attributes"]["langfuse.internal.as_root"] is True
    assert root["attributes"]["langfuse.trace.name"] == "query"
    assert root["attributes"][TYPE] == "chain"
    assert json_attribute(root, "langfuse.observation.input")["question"].startswith("[EMAIL] asks")
    assert json_attribute(root, "langfuse.observation.output")["answer"] == answer["answer"]
    assert "collection:kb" in root["attributes"]["langfuse.trace.tags"]

    # One child span per step, in the order and with the status the answer reports, inside the root's time.
    steps = {s["id"]: s for s in answer["steps"]}
    for step_id, step in steps.items():
        span = spans[step_id]
        assert span["parent_span_id"] == root["span_id"], step_id
        assert root["start_ns"] <= span["start_ns"] <= span["end_ns"] <= root["end_ns"] + 1_000, step_id
        assert abs((span["end_ns"] - span["start_ns"]) / 1e6 - step["elapsed_ms"]) < 1, step_id
    assert spans["guardrails"]["attributes"][TYPE] == "guardrail"
    assert spans["retrieve-1"]["attributes"][TYPE] == "retriever"
    assert spans["evaluate"]["attributes"][TYPE] == "evaluator"
    generate = spans["generate"]
    assert generate["attributes"][TYPE] == "generation"
    assert generate["attributes"]["langfuse.observation.model.name"] == "extractive"
    assert json_attribute(generate, "langfuse.observation.cost_details") == {"total": 0.0}
    assert generate["attributes"]["langfuse.observation.prompt.name"] == answer["prompt"]["name"]
    assert generate["attributes"]["langfuse.observation.prompt.version"] == answer["prompt"]["version"]

    # Events: the route with the guideline that matched, each retrieval iteration, the context's ranks.
    events = {name: s for name, s in spans.items() if s["attributes"].get(TYPE) == "event"}
    assert set(events) >= {"route decision", "iteration 1", "context ranks"}, set(events)
    route = events["route decision"]
    assert route["parent_span_id"] == spans["route"]["span_id"]
    assert json_attribute(route, "langfuse.observation.metadata.guideline") == answer["route"]["guideline"]
    assert json_attribute(route, "langfuse.observation.metadata.strategies") == answer["route"]["route"]["strategies"]
    iteration = events["iteration 1"]
    assert iteration["parent_span_id"] == spans["retrieve-1"]["span_id"]
    strategies = json_attribute(iteration, "langfuse.observation.metadata.strategies")
    assert {s["strategy"] for s in strategies} >= {"semantic", "keyword"}
    passages = json_attribute(events["context ranks"], "langfuse.observation.metadata.passages")
    assert passages[0]["source_uri"] == "tides.md" and passages[0]["ranks"]

    # The evaluation: one score per graded metric and the overall, each with its scorer as the comment.
    scores = {s["name"]: s for s in fake.scores.values() if s["traceId"] == root["trace_id"]}
    graded = {m: v for m, v in answer["evaluation"]["metrics"].items() if v["value"] is not None}
    assert set(scores) == set(graded) | {"overall"}
    for metric, grade in graded.items():
        assert scores[metric]["value"] == pytest.approx(grade["value"])
        assert scores[metric]["comment"].startswith(grade["scorer"] + ":")
        assert scores[metric]["dataType"] == "NUMERIC"
    assert scores["overall"]["value"] == pytest.approx(answer["evaluation"]["overall"])

    # Nothing personal left the service.
    sent = repr([s for s in fake.spans if s["trace_id"] == root["trace_id"]]) + repr(scores)
    assert "jane@example.com" not in sent


def test_an_ingestion_job_is_traced(client: TestClient, fake: FakeLangfuse) -> None:
    response = client.post("/v1/documents", json=[{"source_uri": "moon.md", "title": "Moon",
                                                   "text": "The moon orbits the earth.", "collection": "kb"}])
    job_id = response.json()["job_id"]
    deadline = time.monotonic() + 60
    while client.get(f"/v1/jobs/{job_id}").json()["status"] not in ("succeeded", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    flushed(client)
    deadline = time.monotonic() + 10
    while not [s for s in fake.spans if s["trace_id"] == uuid.UUID(job_id).hex]:
        assert time.monotonic() < deadline, "no trace of the job"
        time.sleep(0.1)
        flushed(client)
    (span,) = [s for s in fake.spans if s["trace_id"] == uuid.UUID(job_id).hex]
    assert span["name"] == "ingestion" and span["attributes"]["langfuse.trace.name"] == "ingestion"
    assert json_attribute(span, "langfuse.observation.output")["documents"]["added"] == 1
    assert json_attribute(span, "langfuse.observation.metadata.status") == "succeeded"


def test_an_llm_generation_carries_model_tokens_cost_and_prompt(databases) -> None:
    with fake_langfuse(public_key=unique_key()) as fake, fake_openai() as llm:
        settings = load_settings(database_url=databases.create(), serve_worker="on", worker_heartbeat_s=1,
                                 llm_base_url=llm.url, llm_api_key="k", llm_timeout_s=5, adaptive_retrieval=False,
                                 eval_llm_judge=False, eval_ragas=False, llm_usd_per_1k_prompt_tokens=0.5,
                                 llm_usd_per_1k_completion_tokens=1.5, **langfuse_settings(fake))
        from rag_service.api import create_app
        with TestClient(create_app(settings)) as client:
            posted = client.post("/v1/documents", json=[{"source_uri": "bread.md", "title": "Bread", "collection": "kb",
                                                         "text": "Let the dough rise for about an hour."}]).json()
            while client.get(posted["status_url"]).json()["status"] not in ("succeeded", "failed"):
                time.sleep(0.2)
            llm.queue('{"reasoning_steps": ["[1] says an hour"], "answer": "About an hour [1].", "citations": [1], '
                      '"confidence": 0.8}')
            answer = client.post("/v1/query", json={"question": "How long should the dough rise?",
                                                    "collection": "kb"}).json()
            assert answer["generator"] == "llm", answer
            flushed(client)
        spans = trace_spans(fake, uuid.UUID(answer["query_id"]).hex)
    generate = spans["generate"]
    tokens = answer["llm_tokens"]
    assert generate["attributes"]["langfuse.observation.model.name"] == answer["model"]
    assert json_attribute(generate, "langfuse.observation.usage_details") == {
        "input": tokens["prompt"], "output": tokens["completion"], "total": tokens["prompt"] + tokens["completion"]}
    cost = json_attribute(generate, "langfuse.observation.cost_details")["total"]
    assert cost == pytest.approx((tokens["prompt"] * 0.5 + tokens["completion"] * 1.5) / 1000)
    assert (generate["attributes"]["langfuse.observation.prompt.name"],
            generate["attributes"]["langfuse.observation.prompt.version"]) == ("answer_cot", 1)
    assert generate["attributes"]["langfuse.observation.output"] == answer["answer"]  # a string goes as is


def _record(n: int) -> TraceRecord:
    now = datetime.now(UTC)
    return TraceRecord(trace_id=uuid.uuid4().hex, name="query",
                       root=Observation(name=f"query {n}", start=now - timedelta(milliseconds=5), end=now))


def _settings(fake: FakeLangfuse, **extra: object) -> SimpleNamespace:
    return SimpleNamespace(**{"langfuse_public_key": SecretStr(fake.public_key), "langfuse_secret_key": SecretStr(
        SECRET_KEY), "langfuse_host": fake.url, "environment": "development", "langfuse_queue_size": 2,
        "langfuse_sample_rate": 1.0, **extra})


def test_a_slow_langfuse_never_holds_a_query_back_the_queue_drops_and_counts() -> None:
    with fake_langfuse(public_key=unique_key()) as fake:
        fake.delay_s = 1.0  # every request takes a second: the sender thread waits, the queue fills
        drops: list[int] = []
        tracer = LangfuseTracer.from_settings(_settings(fake), on_drop=lambda: drops.append(1))
        assert tracer is not None
        try:
            assert tracer.submit(_record(0))
            deadline = time.monotonic() + 10
            while not fake.calls("POST", "/api/public/otel/v1/traces"):  # the sender is now stuck exporting
                assert time.monotonic() < deadline
                time.sleep(0.05)
            slowest = 0.0
            accepted = 0
            for n in range(1, 21):
                started = time.perf_counter()
                accepted += tracer.submit(_record(n))
                slowest = max(slowest, time.perf_counter() - started)
            assert slowest < 0.05  # a submit only queues: no waiting on Langfuse
            assert accepted == 2  # what the queue holds
            assert tracer.dropped == len(drops) == 18
            assert tracer.flush(30)
            roots = {s["name"] for s in fake.spans if s["name"].startswith("query ")}
            assert len(roots) == tracer.sent == 3
        finally:
            tracer.close()


def test_without_keys_nothing_is_built_or_sent_and_one_key_alone_is_named(caplog: pytest.LogCaptureFixture) -> None:
    none = SimpleNamespace(langfuse_public_key=None, langfuse_secret_key=None, langfuse_host=None)
    with caplog.at_level(logging.WARNING):
        assert LangfuseTracer.from_settings(none) is None
        assert not caplog.records
        half = SimpleNamespace(langfuse_public_key=SecretStr("pk-lf-x"), langfuse_secret_key=None, langfuse_host=None)
        assert LangfuseTracer.from_settings(half) is None
    assert "only one is set" in caplog.text and "pk-lf-x" not in caplog.text
    assert load_settings().langfuse_public_key is None  # the default: off


def test_an_eval_run_is_one_trace_with_its_metric_means_as_scores() -> None:
    from evaluation.runner import run_trace
    from tests.evaluation.test_langfuse_export import make_run

    run = make_run().model_copy(update={"finished_at": datetime(2025, 1, 2, 3, 9, 6, tzinfo=UTC)})
    with fake_langfuse(public_key=unique_key()) as fake:
        tracer = LangfuseTracer.from_settings(_settings(fake, langfuse_queue_size=10))
        try:
            assert tracer.submit(run_trace(run, "req-1"))
            assert tracer.flush(30)
        finally:
            tracer.close()
    (span,) = fake.spans
    assert span["trace_id"] == run.id.hex and span["name"] == "eval-run"
    assert (span["end_ns"] - span["start_ns"]) / 1e9 == pytest.approx(300)
    assert json_attribute(span, "langfuse.observation.input")["dataset"]["version"] == "0123456789abcdef"
    assert json_attribute(span, "langfuse.observation.metadata.request_id") == "req-1"
    # The summary's means are the scores; a NaN one is not sent.
    assert {(s["name"], s["value"]) for s in fake.scores.values()} == {("ndcg@10", 0.5)}


def test_status_messages_and_trace_metadata_are_redacted_before_they_leave() -> None:
    from rag_service.observability.logs import Redactor
    from rag_service.pipeline.guardrails import mask_pii

    now = datetime.now(UTC)
    record = TraceRecord(
        trace_id=uuid.uuid4().hex, name="ingestion", metadata={"why": "token sk-secret-123456"},
        root=Observation(name="ingestion", start=now - timedelta(seconds=1), end=now, level="ERROR",
                         status_message="jane@example.com: refused with key sk-secret-123456",
                         metadata={"chunk": "2024-01-15-notes.md", "id": "12345678-1234-5678-1234-567812345678"}))
    with fake_langfuse(public_key=unique_key()) as fake:
        tracer = LangfuseTracer.from_settings(
            _settings(fake), redact=Redactor(["sk-secret-123456"]),
            redact_message=Redactor(["sk-secret-123456"], mask_personal=mask_pii))
        try:
            assert tracer.submit(record) and tracer.flush(30)
        finally:
            tracer.close()
    (span,) = fake.spans
    sent = repr(span)
    assert "sk-secret-123456" not in sent and "jane@example.com" not in sent
    assert span["attributes"]["langfuse.observation.status_message"] == "[EMAIL]: refused with key [REDACTED]"
    # Identifiers are not run through the personal-data masker (a UUID or a dated file name can look
    # like a phone number to it): they arrive as they are.
    assert json_attribute(span, "langfuse.observation.metadata.chunk") == "2024-01-15-notes.md"
    assert json_attribute(span, "langfuse.observation.metadata.id") == "12345678-1234-5678-1234-567812345678"


def test_an_sdk_that_cannot_be_set_up_turns_tracing_off_instead_of_failing(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import rag_service.observability.tracing as tracing

    def broken(*args: object) -> None:
        raise ValueError("Sample rate must be between 0.0 and 1.0")

    monkeypatch.setattr(tracing, "_client", broken)
    with fake_langfuse(public_key=unique_key()) as fake, caplog.at_level(logging.ERROR):
        assert LangfuseTracer.from_settings(_settings(fake)) is None
    assert "Langfuse tracing is off" in caplog.text and "Sample rate" in caplog.text


def test_closing_with_langfuse_hanging_stays_within_its_time_limit() -> None:
    with fake_langfuse(public_key=unique_key()) as fake:
        fake.delay_s = 20.0  # longer than the SDK's own request timeout
        tracer = LangfuseTracer.from_settings(_settings(fake, langfuse_queue_size=10))
        for n in range(3):
            tracer.submit(_record(n))
        started = time.perf_counter()
        tracer.close(timeout_s=1.0)
        assert time.perf_counter() - started < 2.0


def test_sampling_keeps_a_share_of_queries_decided_by_their_id_and_every_job() -> None:
    from rag_service.observability.trace_tree import sampled

    ids = [uuid.uuid4().hex for _ in range(4000)]
    kept = [i for i in ids if sampled(i, 0.25)]
    assert 0.22 < len(kept) / len(ids) < 0.28  # binomial sd 0.007: this fails on a broken rule, not on luck
    assert all(sampled(i, 0.25) for i in kept) and all(sampled(i, 1.0) for i in ids)
    assert not any(sampled(i, 0.0) for i in ids)
    with fake_langfuse(public_key=unique_key()) as fake:
        tracer = LangfuseTracer.from_settings(_settings(fake, langfuse_queue_size=100, langfuse_sample_rate=0.0))
        try:
            assert tracer.submit(_record(1))  # a query outside the sample: skipped, not dropped
            job = _record(2)
            job.name = "ingestion"
            assert tracer.submit(job) and tracer.flush(30)
        finally:
            tracer.close()
    assert [s["name"] for s in fake.spans] == ["query 2"] and tracer.dropped == 0
