"""What a query, an ingestion job or an evaluation run looks like as a Langfuse trace: a tree of
observations with their times, and the scores. Pure data built from records the service already
keeps (the stored query trace, a job's outcome, an eval run's summary), so what is sent can be read
and tested without Langfuse; ``tracing.LangfuseTracer`` sends it.

Ids are derived, not drawn: a query's trace id is its query id (32 hex characters, a valid W3C trace
id), so a Langfuse trace and ``GET /v1/queries/{id}/trace`` name each other, and a score's id is a
UUIDv5 of the trace and the metric, so a later grade of the same answer (the late LLM judge) replaces
the earlier one instead of adding a second.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol

from rag_service.domain.evaluation import EvaluationReport
from rag_service.domain.retrieval import Iteration
from rag_service.domain.traces import QueryTrace

ObservationKind = Literal["span", "generation", "event", "retriever", "guardrail", "evaluator", "chain"]
Level = Literal["DEFAULT", "WARNING", "ERROR"]

_NAMESPACE = uuid.UUID("0b8f6c2e-2f4e-4b8a-9d51-3a7c1e5d9f20")  # fixed: score ids must not change
# Step kinds as Langfuse's observation types, so its UI draws each with its own icon and filter.
_STEP_KINDS: dict[str, ObservationKind] = {
    "guardrails": "guardrail", "retrieve": "retriever", "generate": "generation", "evaluate": "evaluator",
}


@dataclass
class Observation:
    name: str
    start: datetime
    end: datetime
    kind: ObservationKind = "span"
    input: Any = None
    output: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    level: Level = "DEFAULT"
    status_message: str | None = None
    model: str | None = None
    usage: dict[str, int] | None = None
    cost: dict[str, float] | None = None
    prompt: tuple[str, int] | None = None  # (name, version): Langfuse links it to its prompt of that name
    children: list[Observation] = field(default_factory=list)


@dataclass(frozen=True)
class Score:
    id: str
    name: str
    value: float
    comment: str | None = None


@dataclass
class TraceRecord:
    """One Langfuse trace: its id, name and attributes, the tree under one root, and its scores. No
    root: scores for a trace sent earlier (the late grades of an answer)."""

    trace_id: str
    name: str
    root: Observation | None
    user_id: str | None = None
    session_id: str | None = None
    tags: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    scores: list[Score] = field(default_factory=list)

    def walk(self) -> list[Observation]:
        """Every observation, parents before children."""
        found, stack = [], [self.root] if self.root is not None else []
        while stack:
            node = stack.pop()
            found.append(node)
            stack.extend(reversed(node.children))
        return found


class TraceExporter(Protocol):
    def submit(self, record: TraceRecord) -> bool:
        """Queue a trace for an outside tracer (Langfuse); must not block. False: dropped."""
        ...


def sampled(trace_id: str, rate: float) -> bool:
    """Whether a trace is kept at sampling ``rate``: decided by its id (uniform for query ids, which are
    random), so every record of one query (the trace, later its late grades) gets the same answer."""
    if rate >= 1:
        return True
    return int(trace_id[-8:], 16) < rate * 0x1_0000_0000


def score_id(trace_id: str, name: str) -> str:
    return str(uuid.uuid5(_NAMESPACE, f"{trace_id}\n{name}"))


def evaluation_scores(trace_id: str, report: EvaluationReport | None) -> list[Score]:
    """The seven grades and the overall one; the scorer (and its reason) as the comment. A metric
    the scorer could not judge (None) is not a score."""
    if report is None:
        return []
    scores = []
    for metric, graded in report.metrics.items():
        if graded.value is None or not math.isfinite(graded.value):
            continue
        scores.append(Score(score_id(trace_id, metric), metric, float(graded.value),
                            f"{graded.scorer}: {graded.reason}"))
    if report.overall is not None:
        scorers = sorted({g.scorer for g in report.metrics.values() if g.value is not None})
        reasons = "; ".join(report.reasons) if report.reasons else "no metric below its threshold"
        scores.append(Score(score_id(trace_id, "overall"), "overall", float(report.overall),
                            f"weighted mean ({', '.join(scorers)}); review: {report.needs_review} ({reasons})"))
    return scores


def query_trace(trace: QueryTrace, *, answer: str | None, ended_at: datetime, cost_usd: float | None,
                request_id: str | None = None, conversation_id: str | None = None) -> TraceRecord:
    """A query as a trace: the root spans the whole query; one child per pipeline step at the time it
    ran, failed steps at level ERROR and fallbacks at WARNING; the route and the guideline that matched
    as an event under the route step; each retrieval iteration and the context's per-strategy ranks as
    events under their retrieve step; the generate step as a generation with its model, tokens, cost and
    prompt version. ``trace`` and ``answer`` come PII-masked (as stored)."""
    trace_id = trace.query_id.hex
    begins = _offsets(trace)
    total_ms = max((begin + step.elapsed_ms for begin, step in zip(begins, trace.steps, strict=True)), default=0.0)
    started_at = ended_at - timedelta(milliseconds=total_ms)
    at = _clock(started_at)
    route = trace.route or {}
    root = Observation(
        name="query", kind="chain", start=started_at, end=ended_at,
        input={"question": trace.question, "collection": trace.collection},
        output={"answer": answer, "outcome": trace.outcome},
        metadata={"query_id": str(trace.query_id), "outcome": trace.outcome, "guideline": route.get("guideline"),
                  "errors": trace.errors, **({"request_id": request_id} if request_id else {})},
        level="WARNING" if trace.errors else "DEFAULT")  # a step failed or fell back, and the query went on
    loops = list(trace.retrieval.loop if trace.retrieval else [])
    for begin, step in zip(begins, trace.steps, strict=True):
        node = Observation(
            name=step.id, kind=_STEP_KINDS.get(step.kind, "span"), start=at(begin), end=at(begin + step.elapsed_ms),
            metadata={"status": step.status, "attempts": step.attempts},
            level="ERROR" if step.status == "failed" else "WARNING" if step.status == "fallback" else "DEFAULT",
            status_message=step.detail)
        if step.kind == "route":
            node.output = route
            node.children.append(_event("route decision", node.end, {
                "guideline": route.get("guideline"), "guidelines_version": route.get("guidelines_version"),
                "reasons": route.get("reasons"), "confidence": route.get("confidence"), **(route.get("route") or {})}))
        elif step.kind == "retrieve":
            part = _part_index(step.id)
            if trace.retrieval is not None and part < len(trace.retrieval.parts):
                node.input = {"query": trace.retrieval.parts[part]}
            for iteration in loops[part] if part < len(loops) else []:
                node.children.append(_iteration_event(iteration, at(begin)))
        elif step.kind == "generate":
            _as_generation(node, trace, answer, cost_usd)
            node.children.append(_event("context ranks", node.start, {"passages": [
                {"n": c.n, "chunk_id": c.chunk_id, "source_uri": c.source_uri, "score": c.score, "ranks": c.ranks}
                for c in trace.candidates]}))
        elif step.kind == "evaluate" and trace.evaluation is not None:
            node.output = {"overall": trace.evaluation.overall, "needs_review": trace.evaluation.needs_review}
        root.children.append(node)
    return TraceRecord(
        trace_id=trace_id, name="query", root=root,
        user_id=str(trace.api_key_id) if trace.api_key_id else None, session_id=conversation_id,
        tags=["query", f"collection:{trace.collection}", f"outcome:{trace.outcome}"],
        metadata={"collection": trace.collection, "generator": trace.generator},
        scores=evaluation_scores(trace_id, trace.evaluation))


def job_trace(job_id: uuid.UUID, *, kind: str, started_at: datetime, ended_at: datetime, status: str,
              input: dict[str, Any], output: dict[str, Any], error: str | None = None,
              request_id: str | None = None, scores: dict[str, float] | None = None) -> TraceRecord:
    """An ingestion job or an evaluation run: one span from start to end with what it was given and
    what came of it; ``scores`` (an eval run's metric means) as the trace's scores."""
    trace_id = job_id.hex
    root = Observation(name=kind, kind="chain", start=started_at, end=max(started_at, ended_at), input=input,
                       output=output, metadata={"job_id": str(job_id), "status": status,
                                                **({"request_id": request_id} if request_id else {})},
                       level="ERROR" if error else "DEFAULT", status_message=error)
    return TraceRecord(trace_id=trace_id, name=kind, root=root, tags=[kind, f"status:{status}"],
                       metadata={"status": status},
                       scores=[Score(score_id(trace_id, name), name, float(value), f"{kind} mean")
                               for name, value in (scores or {}).items() if math.isfinite(value)])


def _offsets(trace: QueryTrace) -> list[float]:
    """Each step's start in ms after the query's: as recorded, else (a trace stored before offsets
    were) right after the step before it."""
    found, offset = [], 0.0
    for step in trace.steps:
        begin = step.started_ms if step.started_ms is not None else offset
        found.append(begin)
        offset = begin + step.elapsed_ms
    return found


def _clock(started_at: datetime):  # noqa: ANN202 - a small closure
    return lambda offset_ms: started_at + timedelta(milliseconds=offset_ms)


def _part_index(step_id: str) -> int:
    """``retrieve-2`` -> 1 (the steps are numbered from 1, the parts from 0)."""
    _, _, number = step_id.rpartition("-")
    return int(number) - 1 if number.isdigit() else 0


def _event(name: str, at: datetime, metadata: dict[str, Any]) -> Observation:
    return Observation(name=name, kind="event", start=at, end=at, metadata=metadata)


def _iteration_event(iteration: Iteration, loop_start: datetime) -> Observation:
    return Observation(
        name=f"iteration {iteration.number}", kind="event", start=loop_start, end=loop_start,
        input={"queries": iteration.queries, "top_k": iteration.top_k},
        output={"results": iteration.results, "confidence": iteration.confidence},
        metadata={"thought": iteration.thought, "action": iteration.action, "filter_relaxed": iteration.filter_relaxed,
                  "elapsed_ms": iteration.elapsed_ms,
                  "strategies": [{"strategy": s.strategy, "hits": s.hits, "elapsed_ms": s.elapsed_ms, "error": s.error}
                                 for s in iteration.strategies]})


def _as_generation(node: Observation, trace: QueryTrace, answer: str | None, cost_usd: float | None) -> None:
    node.kind = "generation"
    node.model = trace.model or trace.generator
    node.input = {"question": trace.question, "passages": [c.chunk_id for c in trace.candidates]}
    node.output = answer
    node.metadata["generator"] = trace.generator
    if trace.fallback_reason:
        node.metadata["fallback_reason"] = trace.fallback_reason
    if trace.llm_tokens:
        usage = {"input": int(trace.llm_tokens.get("prompt", 0)), "output": int(trace.llm_tokens.get("completion", 0))}
        node.usage = {**usage, "total": usage["input"] + usage["output"]}
    if cost_usd is not None:
        node.cost = {"total": float(cost_usd)}
    prompt = trace.prompt or {}
    if prompt.get("name") and isinstance(prompt.get("version"), int):
        node.prompt = (str(prompt["name"]), int(prompt["version"]))
        node.metadata["prompt"] = prompt
