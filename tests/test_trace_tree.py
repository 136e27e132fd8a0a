"""What goes to Langfuse, as pure data: times from the recorded step offsets, events under their steps,
scores with stable ids (no server, no database)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from rag_service.domain import EvaluationReport, QueryTrace, RetrievalSummary, StepRecord
from rag_service.domain.evaluation import MetricValue
from rag_service.domain.retrieval import Iteration, StrategyReport
from rag_service.observability.trace_tree import query_trace, score_id

ENDED = datetime(2026, 11, 25, 12, 0, 0, tzinfo=UTC)


def trace(**extra: object) -> QueryTrace:
    iteration = Iteration(number=1, thought="first look", action="search", queries=["tides"], top_k=5,
                          strategies=[StrategyReport(strategy="semantic", query="tides", hits=3, elapsed_ms=4.0)],
                          results=3, confidence=0.8, elapsed_ms=5.0)
    fields: dict = {
        "query_id": uuid.UUID("12345678-1234-5678-1234-567812345678"), "collection": "kb",
        "question": "why tides?", "outcome": "answered",
        "route": {"guideline": "facts", "reasons": ["fact question"], "confidence": 0.9,
                  "route": {"strategies": ["semantic"], "top_k": 5}},
        # retrieve-1 and retrieve-2 ran at the same time; the old record has no offsets at all.
        "steps": [StepRecord(id="route", kind="route", status="ok", elapsed_ms=2, started_ms=0),
                  StepRecord(id="retrieve-1", kind="retrieve", status="ok", elapsed_ms=30, started_ms=2),
                  StepRecord(id="retrieve-2", kind="retrieve", status="failed", elapsed_ms=10, started_ms=2,
                             detail="timed out"),
                  StepRecord(id="generate", kind="generate", status="fallback", elapsed_ms=8, started_ms=32,
                             detail="LLM down")],
        "timings_ms": {}, "generator": "llm", "model": "m", "llm_tokens": {"prompt": 100, "completion": 20},
        "prompt": {"name": "answer_cot", "version": 3},
        "retrieval": RetrievalSummary(parts=["tides", "moon"], results=3, confidence=0.8, iterations=1,
                                      reranked=False, strategies=["semantic"], loop=[[iteration], []]),
        "evaluation": EvaluationReport(overall=0.7, needs_review=False, metrics={
            "faithfulness": MetricValue(value=0.9, reason="supported.", scorer="local-v1"),
            "freshness": MetricValue(value=None, reason="no dates.", scorer="local-v1")}),
    }
    return QueryTrace(**(fields | extra))


def test_steps_keep_their_recorded_times_levels_and_events() -> None:
    record = query_trace(trace(), answer="Because of the moon.", ended_at=ENDED, cost_usd=0.002)
    assert record.trace_id == "12345678123456781234567812345678"
    root = record.root
    assert root.end == ENDED and root.start == ENDED - timedelta(milliseconds=40)  # the last step ends at 40 ms
    steps = {node.name: node for node in root.children}
    assert steps["retrieve-1"].start == steps["retrieve-2"].start == root.start + timedelta(milliseconds=2)
    assert steps["retrieve-2"].level == "ERROR" and steps["retrieve-2"].status_message == "timed out"
    assert steps["generate"].level == "WARNING"
    # Each part's iterations under its own retrieve step.
    assert [e.name for e in steps["retrieve-1"].children] == ["iteration 1"]
    assert steps["retrieve-2"].children == [] and steps["retrieve-2"].input == {"query": "moon"}
    assert steps["route"].children[0].metadata["guideline"] == "facts"
    generation = steps["generate"]
    assert (generation.kind, generation.model, generation.prompt) == ("generation", "m", ("answer_cot", 3))
    assert generation.usage == {"input": 100, "output": 20, "total": 120} and generation.cost == {"total": 0.002}


def test_scores_skip_what_was_not_judged_and_keep_their_ids() -> None:
    record = query_trace(trace(), answer=None, ended_at=ENDED, cost_usd=None)
    scores = {s.name: s for s in record.scores}
    assert set(scores) == {"faithfulness", "overall"}  # freshness could not be judged
    assert scores["faithfulness"].comment == "local-v1: supported."
    assert scores["faithfulness"].id == score_id(record.trace_id, "faithfulness")  # a late grade overwrites it
    again = query_trace(trace(), answer=None, ended_at=ENDED + timedelta(hours=1), cost_usd=None)
    assert [s.id for s in again.scores] == [s.id for s in record.scores]
    assert next(n for n in record.walk() if n.name == "generate").cost is None


def test_steps_without_offsets_are_laid_end_to_end() -> None:
    old = trace(steps=[StepRecord(id="route", kind="route", status="ok", elapsed_ms=5),
                       StepRecord(id="generate", kind="generate", status="ok", elapsed_ms=10)])
    record = query_trace(old, answer="x", ended_at=ENDED, cost_usd=None)
    route, generate = record.root.children
    assert route.end == generate.start and generate.end - route.start == timedelta(milliseconds=15)
    assert (record.root.start, record.root.end) == (route.start, generate.end)
