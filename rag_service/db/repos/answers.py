"""Logged answers as their askers see them (for ``GET /v1/answers/{id}``), and user feedback on
them, which may queue an answer for review."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text

from rag_service.db.engine import Database
from rag_service.db.repos.reviews import enqueue
from rag_service.db.repos.scores import stored_scores
from rag_service.domain import DecisionKind, ReviewStatus, ReviewTrigger
from rag_service.domain.review import StoredScores


@dataclass(frozen=True)
class AnswerRecord:
    """A logged answer with what reviewing it decided (for ``GET /v1/answers/{id}`` and feedback)."""

    answer_id: uuid.UUID
    collection: str
    question: str
    question_hash: str | None
    api_key_id: uuid.UUID | None
    principals: list[str]  # the asker's, which decided what the answer could read
    held: bool
    text: str
    short_answer: str | None
    citations: list[dict[str, Any]]
    prompt_name: str | None
    prompt_version: int | None
    created_at: datetime
    scores: list[StoredScores]
    review_id: uuid.UUID | None
    review_status: ReviewStatus | None
    decision: DecisionKind | None
    corrected_answer: str | None

    @property
    def overall(self) -> float | None:
        """The latest scorer's overall score."""
        return self.scores[-1].overall if self.scores else None


class AnswerRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def answer(self, answer_id: uuid.UUID) -> AnswerRecord | None:
        """The logged answer of query ``answer_id`` with its scores and review state (None: no
        such query, or it has no answer)."""
        async with self._db.connect() as conn:
            row = (await conn.execute(text(
                "SELECT q.id AS answer_id, q.collection, q.question, q.question_hash, q.api_key_id, q.principals, "
                "a.held, a.text, a.short_answer, a.citations, a.prompt_name, a.prompt_version, a.created_at, "
                "r.id AS review_id, r.status AS review_status, d.decision, d.corrected_answer "
                "FROM queries q JOIN answers a ON a.query_id = q.id LEFT JOIN review_items r ON r.query_id = q.id "
                "LEFT JOIN review_decisions d ON d.review_id = r.id WHERE q.id = :id"), {"id": answer_id})).first()
            if row is None:
                return None
            scores = await stored_scores(conn, answer_id)
        return AnswerRecord(**dict(row._mapping), scores=scores)

    async def add_feedback(self, record: AnswerRecord, *, rating: int, comment: str | None,
                           key_id: uuid.UUID | None, trigger: ReviewTrigger | None) -> tuple[int, uuid.UUID | None]:
        """Store the feedback and, when ``trigger`` is given, queue the answer (or add the reason
        to its item) in the same transaction. Returns (feedback id, review item id or None)."""
        async with self._db.begin() as conn:
            feedback_id = (await conn.execute(text(
                "INSERT INTO answer_feedback (query_id, rating, comment, api_key_id) "
                "VALUES (:qid, :rating, :comment, :key_id) RETURNING id"),
                {"qid": record.answer_id, "rating": rating, "comment": comment, "key_id": key_id})).scalar_one()
            review_id = None
            if trigger is not None:
                review_id = await enqueue(conn, query_id=record.answer_id, collection=record.collection,
                                          question_hash=record.question_hash, trigger=trigger,
                                          prompt_name=record.prompt_name, prompt_version=record.prompt_version)
        return feedback_id, review_id
