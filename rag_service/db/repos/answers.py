"""Logged answers as their askers see them (for ``GET /v1/answers/{id}``), user feedback on
them, which may queue an answer for review, and what deleting a document does to them."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

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


# What a citation of a deleted document keeps: where it pointed (ids, source, title, offsets), not
# the quote, which is the deleted document's text.
_FORGOTTEN_CITATION = json.dumps({"deleted": True, "quote": ""})
_FORGOTTEN_PASSAGE = json.dumps({"deleted": True})


def _naming(array: str, key: str) -> str:
    """SQL: the JSON array ``array`` has an element whose ``key`` is in :ids, not yet marked deleted."""
    return (f"EXISTS (SELECT 1 FROM jsonb_array_elements({array}) AS e(c) WHERE e.c->>'{key}' = ANY(:ids) "
            "AND NOT COALESCE((e.c->>'deleted')::boolean, false))")


def _forgotten(array: str, key: str) -> str:
    """SQL: the JSON array ``array``, its elements whose ``key`` is in :ids merged with :mark."""
    return (f"(SELECT COALESCE(jsonb_agg(CASE WHEN e.c->>'{key}' = ANY(:ids) THEN e.c || CAST(:mark AS jsonb) "
            f"ELSE e.c END ORDER BY e.i), '[]'::jsonb) FROM jsonb_array_elements({array}) WITH ORDINALITY AS e(c, i))")


_FORGET_CITATIONS = "UPDATE {table} SET citations = {new} WHERE {where}"
_FORGET_PASSAGES = (
    "UPDATE query_traces SET trace = jsonb_set(trace, '{{candidates}}', {new}) WHERE collection = :collection "
    "AND jsonb_typeof(trace->'candidates') = 'array' AND {where}")


async def forget_documents(conn: AsyncConnection, document_ids: Sequence[uuid.UUID]) -> None:
    """Before documents are deleted, in the deleting transaction: every logged answer and golden
    item that cites them keeps its text, but those citations are marked ``deleted`` and lose their
    quotes; stored traces mark the passages of those documents ``deleted`` (they hold no text).

    The documents are locked first (FOR UPDATE): an answer being logged meanwhile locks the
    documents it cites (``LOCK_CITED``), so it either commits before the updates below read
    the answers, or waits and then finds its documents gone."""
    if not document_ids:
        return
    ids = sorted({str(i) for i in document_ids})
    sources = (await conn.execute(text(
        "SELECT c.name AS collection, d.source_uri FROM documents d JOIN collections c ON c.id = d.collection_id "
        "WHERE d.id = ANY(CAST(:ids AS uuid[])) ORDER BY d.id FOR UPDATE OF d"), {"ids": ids})).all()
    if not sources:  # none of them exists (any more): nothing cites them that was not forgotten
        return
    for table in ("answers", "golden_items"):
        await conn.execute(text(_FORGET_CITATIONS.format(
            table=table, new=_forgotten("citations", "document_id"), where=_naming("citations", "document_id"))),
            {"ids": ids, "mark": _FORGOTTEN_CITATION})
    # A trace names its passages by chunk and source: the source also covers chunks of earlier versions.
    by_collection: dict[str, list[str]] = {}
    for row in sources:
        by_collection.setdefault(row.collection, []).append(row.source_uri)
    candidates = "trace->'candidates'"
    for collection, uris in by_collection.items():
        await conn.execute(text(_FORGET_PASSAGES.format(
            new=_forgotten(candidates, "source_uri"), where=_naming(candidates, "source_uri"))),
            {"collection": collection, "ids": uris, "mark": _FORGOTTEN_PASSAGE})


# In the statement logging an answer: lock the documents it cites (FOR KEY SHARE, so a delete
# waits for this commit and then forgets this answer too); the ones it returns are still there.
LOCK_CITED = "SELECT id::text AS id FROM documents WHERE id = ANY(CAST(:cited AS uuid[])) ORDER BY id FOR KEY SHARE"


async def forget_vanished(conn: AsyncConnection, query_id: uuid.UUID, gone: Sequence[str]) -> None:
    """In the transaction logging answer ``query_id``, after ``LOCK_CITED`` found the documents
    ``gone`` (deleted while it was being answered): forget its citations of them."""
    if gone:
        await conn.execute(text(
            f"UPDATE answers SET citations = {_forgotten('citations', 'document_id')} WHERE query_id = :qid"),
            {"ids": sorted(set(gone)), "mark": _FORGOTTEN_CITATION, "qid": query_id})
