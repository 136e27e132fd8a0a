"""Pure pieces of answering a query: the scope its retrievals share, merging the parts'
retrievals, narrowing dates to the question's time range, summarising retrieval for the result,
and what the query log stores."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from rag_service.domain import (
    AnswerLogEntry,
    Candidate,
    EvaluationReport,
    GeneratedAnswer,
    QueryLogEntry,
    QueryRequest,
    QueryResult,
    QueryTrace,
    RetrievalRequest,
    RetrievalResult,
    RetrievalSummary,
    ReviewTier,
    SearchRequest,
    TimeRangeModel,
    TraceCandidate,
)
from rag_service.pipeline.evaluation import Graded
from rag_service.pipeline.guardrails import mask_pii, mask_pii_deep
from rag_service.pipeline.retrieval.search import to_retrieval_request
from rag_service.review.gate import trigger_for


def lowest(values: Iterable[float | None]) -> float | None:
    """The lowest of the confidences that could be judged (None when none could)."""
    judged = [v for v in values if v is not None]
    return round(min(judged), 4) if judged else None


def intersect_dates(date_from: datetime | None, date_to: datetime | None,
                    window: TimeRangeModel) -> dict[str, datetime | None]:
    """The caller's date filter narrowed to the question's time range. Ranges end exclusively;
    ``date_to`` is inclusive, hence one microsecond before the end."""
    start = max((d for d in (date_from, window.start) if d is not None), default=None)
    end = window.end - timedelta(microseconds=1) if window.end is not None else None
    end = min((d for d in (date_to, end) if d is not None), default=None)
    return {"date_from": start, "date_to": end}


def merge_contexts(lists: Sequence[Sequence[Candidate]], limit: int) -> list[Candidate]:
    """Round-robin over the parts' ranked lists, without duplicates: each part gets its best in."""
    merged: list[Candidate] = []
    seen: set[uuid.UUID] = set()
    for rank in range(max((len(x) for x in lists), default=0)):
        for candidates in lists:
            if rank < len(candidates) and candidates[rank].hit.chunk_id not in seen:
                seen.add(candidates[rank].hit.chunk_id)
                merged.append(candidates[rank])
    return merged[:limit]


def retrieval_summary(parts: list[str], retrievals: Sequence[RetrievalResult]) -> RetrievalSummary:
    return RetrievalSummary(
        parts=parts, results=sum(len(r.candidates) for r in retrievals),
        confidence=lowest(r.confidence for r in retrievals),
        iterations=sum(len(r.iterations) for r in retrievals),
        reranked=any(r.rerank is not None and r.rerank.applied for r in retrievals),
        rerank_error=next((r.rerank.error for r in retrievals if r.rerank and r.rerank.error), None),
        strategies=sorted({s.strategy for r in retrievals for i in r.iterations for s in i.strategies}),
        loop=[list(r.iterations) for r in retrievals],
    )


def fill_answer(result: QueryResult, answer: GeneratedAnswer) -> None:
    result.answer = answer.answer
    result.short_answer = answer.short_answer
    result.citations = answer.citations
    result.claims = answer.claims
    result.confidence = answer.confidence
    result.reasoning_steps = answer.reasoning_steps
    result.generator, result.model = answer.generator, answer.model
    result.fallback_reason = answer.fallback_reason
    result.closest_sources = answer.closest_sources
    result.answerability = answer.answerability
    if not answer.answered:
        result.outcome = "no_answer"
    if answer.prompt_name:
        result.prompt = {"name": answer.prompt_name, "version": answer.prompt_version}


def context_log(context: Sequence[Candidate]) -> list[dict[str, Any]]:
    """What the generator read, as the answer log keeps it for reviewers."""
    return [{"n": n, "chunk_id": str(c.hit.chunk_id),
             "score": c.rerank_score if c.rerank_score is not None else c.fused_score}
            for n, c in enumerate(context, start=1)]


def log_entry(request: QueryRequest, masked_question: str, result: QueryResult, timings: dict[str, float], *,
              api_key_id: uuid.UUID | None = None, graded: Graded | None = None,
              context: list[dict[str, Any]] | None = None) -> QueryLogEntry:
    """What the query log stores: everything taken from the question passes through the PII
    mask (entities included). ``graded`` adds the scores and, when the gate asks for it, the
    review item."""
    answer = None
    verdict = graded.verdict if graded is not None else None
    # A "does not answer" is stored too: it is what the caller got, and an experiment must count it.
    if result.answer is not None and result.outcome in ("answered", "no_answer"):
        answer = AnswerLogEntry(
            text=mask_pii(result.answer), short=result.short_answer,
            citations=[c.model_dump(mode="json") for c in result.citations], confidence=result.confidence,
            generator=result.generator or "none", model=result.model,
            prompt_name=(result.prompt or {}).get("name"), prompt_version=(result.prompt or {}).get("version"),
            experiment_id=(result.prompt or {}).get("experiment_id"), variant=(result.prompt or {}).get("variant"),
            experiment_unit=(result.prompt or {}).get("unit"), llm_tokens=result.llm_tokens,
            timings=timings, context=context or [], held=bool(verdict and verdict.hold and verdict.needs_review),
        )
    return QueryLogEntry(
        query_id=result.query_id, conversation_id=request.conversation_id, collection=request.collection,
        principals=request.principals, question=masked_question, resolved_question=mask_pii(result.intent.question),
        intent=mask_pii_deep(result.intent.model_dump(mode="json")),
        route=mask_pii_deep(result.route.model_dump(mode="json")), guardrails=result.guardrails,
        outcome=result.outcome, answer=answer,
        subject=mask_pii(result.intent.subject) if result.intent.subject else None,
        question_hash=question_hash(masked_question), api_key_id=api_key_id,
        evaluation=masked_report(graded.report) if graded is not None else None,
        review=trigger_for(verdict, graded.evaluation) if graded is not None else None,
        review_id=result.review_id,
    )


HELD = ("This answer is waiting for a reviewer before it is shown. Fetch it with GET /v1/answers/{id} "
        "once the review is done.")
CANNOT_ANSWER = ("I cannot answer this reliably yet: the answer I found scored too low on its checks. A reviewer "
                 "will look at it; fetch the reviewed answer with GET /v1/answers/{id}.")


def hold(result: QueryResult, tier: ReviewTier | None) -> None:
    """Hold mode: the caller gets the review id instead of an answer that scored below the gate
    (below the high-priority threshold, a stated "cannot answer reliably yet")."""
    template = CANNOT_ANSWER if tier == "high" else HELD
    result.outcome = "pending_review"
    result.answer = template.replace("{id}", str(result.query_id))
    result.short_answer = None
    result.citations, result.claims, result.reasoning_steps = [], [], []
    if result.evaluation is not None:  # values only: reasons quote the held answer
        result.evaluation = result.evaluation.model_copy(update={
            "reasons": ["held for review"],
            "metrics": {m: v.model_copy(update={"reason": "withheld until a reviewer decides."})
                        for m, v in result.evaluation.metrics.items()}})


def masked_report(report: EvaluationReport) -> EvaluationReport:
    """The grades as stored: reasons quote the answer and the question, so they are PII-masked."""
    return EvaluationReport.model_validate(mask_pii_deep(report.model_dump(mode="json")))


def question_hash(question: str) -> str:
    """The same question asked again (case and spacing aside) hashes the same: review priority
    counts its traffic."""
    return hashlib.sha256(" ".join(question.lower().split()).encode()).hexdigest()[:32]


def trace_of(request: QueryRequest, masked_question: str, result: QueryResult, retrieval_event: dict[str, Any] | None,
             api_key_id: uuid.UUID | None) -> QueryTrace:
    """The query's stored trace, masked as the query log is. ``retrieval_event`` is what the
    "retrieval" event carried: the context's passages with each strategy's rank."""
    errors = [f"{step.id}: {step.status}" + (f" ({step.detail})" if step.detail else "")
              for step in result.steps if step.status in ("failed", "fallback")]
    candidates = [TraceCandidate.model_validate(c) for c in (retrieval_event or {}).get("results", [])]
    return QueryTrace(
        query_id=result.query_id, collection=request.collection, api_key_id=api_key_id,
        principals=list(request.principals), question=masked_question, outcome=result.outcome,
        route=mask_pii_deep(result.route.model_dump(mode="json")), timings_ms=result.timings_ms,
        steps=[s.model_copy(update={"detail": mask_pii(s.detail)}) if s.detail else s for s in result.steps],
        # The retrieval summary's parts are the question's parts, and an experiment unit may be a
        # caller's conversation id: masked like everything else taken from the question.
        retrieval=mask_pii_deep(result.retrieval.model_dump(mode="json")) if result.retrieval else None,
        candidates=candidates, errors=[mask_pii(e) for e in errors], generator=result.generator, model=result.model,
        prompt=mask_pii_deep(result.prompt) if result.prompt else None, fallback_reason=result.fallback_reason,
        llm_tokens=result.llm_tokens,
        evaluation=masked_report(result.evaluation) if result.evaluation is not None else None)


def retrieval_scope(request: QueryRequest, question: str) -> RetrievalRequest:
    """The scope every retrieval of this query shares (validated: bad filters are a 422)."""
    return to_retrieval_request(SearchRequest.model_construct(
        query=question, collection=request.collection, filters=request.filters, principals=request.principals,
        strategies=None, top_k=10, rerank=None, adaptive=None, expand_parents=False))
