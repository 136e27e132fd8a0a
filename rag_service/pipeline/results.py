"""Pure pieces of answering a query: merging the parts' retrievals, narrowing dates to the
question's time range, summarising retrieval for the result, and what the query log stores."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from rag_service.domain import (
    AnswerLogEntry,
    Candidate,
    GeneratedAnswer,
    QueryLogEntry,
    QueryRequest,
    QueryResult,
    RetrievalResult,
    RetrievalSummary,
    TimeRangeModel,
)
from rag_service.pipeline.guardrails import mask_pii, mask_pii_deep


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
    if answer.prompt_name:
        result.prompt = {"name": answer.prompt_name, "version": answer.prompt_version}


def log_entry(request: QueryRequest, masked_question: str, result: QueryResult,
              timings: dict[str, float]) -> QueryLogEntry:
    """What the query log stores: everything taken from the question passes through the PII
    mask (entities included)."""
    answer = None
    if result.answer is not None and result.outcome == "answered":
        answer = AnswerLogEntry(
            text=mask_pii(result.answer), short=result.short_answer,
            citations=[c.model_dump(mode="json") for c in result.citations], confidence=result.confidence,
            generator=result.generator or "none", model=result.model,
            prompt_name=(result.prompt or {}).get("name"), prompt_version=(result.prompt or {}).get("version"),
            timings=timings,
        )
    return QueryLogEntry(
        query_id=result.query_id, conversation_id=request.conversation_id, collection=request.collection,
        principals=request.principals, question=masked_question, resolved_question=mask_pii(result.intent.question),
        intent=mask_pii_deep(result.intent.model_dump(mode="json")),
        route=mask_pii_deep(result.route.model_dump(mode="json")), guardrails=result.guardrails,
        outcome=result.outcome, answer=answer,
        subject=mask_pii(result.intent.subject) if result.intent.subject else None,
    )
