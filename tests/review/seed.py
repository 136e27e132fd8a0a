"""Logged answers for review tests, written through QueryLog.record as the pipeline writes them,
plus direct SQL for what a test needs to arrange (age, traffic, chunks)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import text

from rag_service.db.engine import Database
from rag_service.db.repos import QueryLog
from rag_service.domain import AnswerLogEntry, EvaluationReport, MetricValue, QueryLogEntry, ReviewTrigger


def citation(n: int, chunk_id: uuid.UUID, document_id: uuid.UUID, quote: str = "Reset it from the settings page.",
             start: int = 0) -> dict[str, Any]:
    return {"n": n, "chunk_id": str(chunk_id), "document_id": str(document_id), "source_uri": "help.md",
            "title": "Help", "start_char": start, "end_char": start + len(quote), "quote": quote, "verified": True}


async def seed_answer(db: Database, *, collection: str = "kb", question: str = "How do I reset my password?",
                      question_hash: str | None = None, overall: float | None = 0.5,
                      metrics: dict[str, float] | None = None, queue: bool = True, tier: str = "normal",
                      flagged: Sequence[str] = (), reasons: Sequence[str] | None = None, held: bool = False,
                      citations: list[dict[str, Any]] | None = None, context: list[dict[str, Any]] | None = None,
                      prompt_name: str | None = "answer_cot", prompt_version: int | None = 1,
                      answer: str = "Reset it from the settings page [1].",
                      api_key_id: uuid.UUID | None = None,
                      principals: Sequence[str] = ()) -> tuple[uuid.UUID, uuid.UUID | None]:
    """Log one answered query (scored, and queued unless ``queue`` is False); returns (query id,
    review item id or None)."""
    query_id = uuid.uuid4()
    metrics = metrics if metrics is not None else {"faithfulness": 0.4, "relevance": 0.9}
    report = EvaluationReport(
        overall=overall, needs_review=queue, reasons=list(reasons or ()),
        metrics={m: MetricValue(value=v, reason=f"{m} was {v}", scorer="local-v1") for m, v in metrics.items()})
    trigger = None
    if queue:
        trigger = ReviewTrigger(source="evaluator", tier=tier, flagged=tuple(flagged), overall=overall, held=held,
                                reasons=tuple(reasons) if reasons is not None else (f"overall: {overall} < 0.80",))
    entry = QueryLogEntry(
        query_id=query_id, conversation_id=None, collection=collection, principals=list(principals),
        question=question,
        resolved_question=question, intent={"query_type": "factual", "question": question},
        route={"guideline": "default-answer", "strategies": ["semantic"]}, guardrails={},
        outcome="pending_review" if held else "answered",
        answer=AnswerLogEntry(text=answer, short=None, citations=citations or [], confidence=0.7,
                              generator="extractive", model=None, prompt_name=prompt_name,
                              prompt_version=prompt_version, timings={}, context=context or [], held=held),
        subject=None, question_hash=question_hash, evaluation=report, review=trigger, api_key_id=api_key_id)
    await cited_documents_exist(db, collection, citations or [])
    await QueryLog(db).record(entry)
    async with db.connect() as conn:
        review_id = (await conn.execute(text("SELECT id FROM review_items WHERE query_id = :q"),
                                        {"q": query_id})).scalar_one_or_none()
    return query_id, review_id


async def cited_documents_exist(db: Database, collection: str, citations: list[dict[str, Any]]) -> None:
    """The documents the citations name, created when missing: the pipeline cites only documents
    that exist, and the query log forgets citations of any deleted before the answer was logged."""
    if not citations:
        return
    async with db.begin() as conn:
        collection_id = (await conn.execute(text(
            "INSERT INTO collections (name) VALUES (:n) ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name "
            "RETURNING id"), {"n": collection})).scalar_one()
        for document_id in sorted({str(c["document_id"]) for c in citations}):
            await conn.execute(text(
                "INSERT INTO documents (id, collection_id, source_uri, title, content_hash) "
                "VALUES (:id, :c, :uri, 'Help', 'h') ON CONFLICT DO NOTHING"),
                {"id": document_id, "c": collection_id, "uri": f"help-{document_id}.md"})


def seed(db_run: Callable[..., Any], **kwargs: Any) -> tuple[uuid.UUID, uuid.UUID | None]:
    """``seed_answer`` from a synchronous test, through the ``db_run`` fixture."""
    return db_run(lambda db: seed_answer(db, **kwargs))


async def add_traffic(db: Database, question_hash: str, count: int, collection: str = "kb",
                      age_s: float = 0) -> None:
    """``count`` more logged queries with this question hash (without answers)."""
    async with db.begin() as conn:
        for _ in range(count):
            await conn.execute(text(
                "INSERT INTO queries (id, collection, question, outcome, question_hash, created_at) "
                "VALUES (:id, :c, 'same question', 'answered', :h, now() - make_interval(secs => :age))"),
                {"id": uuid.uuid4(), "c": collection, "h": question_hash, "age": age_s})


async def backdate(db: Database, review_id: uuid.UUID, seconds: float) -> None:
    async with db.begin() as conn:
        await conn.execute(text(
            "UPDATE review_items SET created_at = now() - make_interval(secs => :s) WHERE id = :id"),
            {"s": seconds, "id": review_id})


async def add_chunk(db: Database, collection: str, text_: str) -> tuple[uuid.UUID, uuid.UUID]:
    """A document with one chunk; returns (chunk id, document id)."""
    chunk_id, document_id = uuid.uuid4(), uuid.uuid4()
    async with db.begin() as conn:
        collection_id = (await conn.execute(text(
            "INSERT INTO collections (name) VALUES (:n) ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name "
            "RETURNING id"), {"n": collection})).scalar_one()
        await conn.execute(text(
            "INSERT INTO documents (id, collection_id, source_uri, title, content_hash) "
            "VALUES (:id, :c, :uri, 'Help', 'h')"), {"id": document_id, "c": collection_id,
                                                    "uri": f"help-{document_id}.md"})
        await conn.execute(text(
            "INSERT INTO chunks (id, document_id, collection_id, ordinal, text, start_char, end_char, token_count, "
            "content_hash) VALUES (:id, :d, :c, 0, :t, 0, :e, 8, 'h')"),
            {"id": chunk_id, "d": document_id, "c": collection_id, "t": text_, "e": len(text_)})
    return chunk_id, document_id
