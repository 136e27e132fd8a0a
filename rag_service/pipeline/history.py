"""Persistence for the query pipeline: versioned guidelines, queries with their answers, and
conversation turns (what a follow-up may refer back to)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.sql.expression import bindparam

from rag_service.db.engine import Database
from rag_service.pipeline.intent import Turn
from rag_service.pipeline.router import GuidelineSet, default_guidelines


class GuidelineRepository:
    """Guidelines stored as versions; the newest is current. The shipped defaults become version
    1 on first use. Reads are cached for ``ttl_s`` so a query does not cost a round trip; a PUT
    through this process is seen at once, through another process within the TTL."""

    def __init__(self, db: Database, ttl_s: float = 5.0) -> None:
        self._db = db
        self._ttl_s = ttl_s
        self._cached: tuple[float, int, GuidelineSet] | None = None

    async def current(self) -> tuple[int, GuidelineSet]:
        now = time.monotonic()
        if self._cached and now - self._cached[0] < self._ttl_s:
            return self._cached[1], self._cached[2]
        async with self._db.connect() as conn:
            row = (await conn.execute(text(
                "SELECT version, document FROM guideline_sets ORDER BY version DESC LIMIT 1"))).first()
        if row is None:
            version = await self._seed()
            found = (version, default_guidelines())
        else:
            found = (row.version, GuidelineSet.model_validate(row.document))
        self._cached = (now, *found)
        return found

    async def _seed(self) -> int:
        async with self._db.begin() as conn:
            # Serialise concurrent first uses so only one of them writes version 1.
            await conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('guideline_sets seed'))"))
            existing = (await conn.execute(text("SELECT max(version) FROM guideline_sets"))).scalar_one()
            if existing is not None:
                return int(existing)
            return await self._insert(conn, default_guidelines(), "shipped defaults", "system")

    async def put(self, guidelines: GuidelineSet, comment: str | None, author: str | None) -> int:
        async with self._db.begin() as conn:
            version = await self._insert(conn, guidelines, comment, author)
        self._cached = (time.monotonic(), version, guidelines)
        return version

    @staticmethod
    async def _insert(conn: Any, guidelines: GuidelineSet, comment: str | None, author: str | None) -> int:
        stmt = text("INSERT INTO guideline_sets (document, comment, created_by) VALUES (:doc, :comment, :author) "
                    "RETURNING version").bindparams(bindparam("doc", type_=JSONB))
        result = await conn.execute(stmt, {"doc": guidelines.model_dump(mode="json", exclude_none=True),
                                           "comment": comment, "author": author})
        return int(result.scalar_one())

    async def versions(self, limit: int = 20) -> list[dict[str, Any]]:
        async with self._db.connect() as conn:
            rows = await conn.execute(text(
                "SELECT version, comment, created_by, created_at FROM guideline_sets ORDER BY version DESC "
                "LIMIT :limit"), {"limit": limit})
            return [dict(r._mapping) for r in rows]


class QueryLog:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def turns(self, conversation_id: str, collection: str, principals: Sequence[str],
                    limit: int = 5) -> list[Turn]:
        """The conversation's last turns, oldest first; none when the conversation belongs to
        another collection or caller."""
        async with self._db.connect() as conn:
            rows = (await conn.execute(text(
                "SELECT t.question, t.subject FROM conversation_turns t JOIN conversations c "
                "ON c.id = t.conversation_id WHERE t.conversation_id = :cid AND c.collection = :collection "
                "AND c.principals = CAST(:principals AS text[]) ORDER BY t.id DESC LIMIT :limit"),
                {"cid": conversation_id, "collection": collection, "principals": sorted(set(principals)),
                 "limit": limit})).all()
        return [Turn(question=r.question, subject=r.subject) for r in reversed(rows)]

    async def record(self, *, query_id: uuid.UUID, conversation_id: str | None, collection: str,
                     principals: Sequence[str], question: str, resolved_question: str | None, intent: dict,
                     route: dict, guardrails: dict, outcome: str, answer: dict | None, subject: str | None) -> None:
        """One transaction: the query, its answer (if any) and the conversation turn (only in a
        conversation this collection and caller own)."""
        json_params = [bindparam(n, type_=JSONB) for n in ("intent", "route", "guardrails")]
        async with self._db.begin() as conn:
            if conversation_id is not None:
                owned = (await conn.execute(text(
                    "INSERT INTO conversations (id, collection, principals) "
                    "VALUES (:cid, :collection, CAST(:principals AS text[])) ON CONFLICT (id) DO UPDATE "
                    "SET updated_at = now() WHERE conversations.collection = EXCLUDED.collection "
                    "AND conversations.principals = EXCLUDED.principals RETURNING id"),
                    {"cid": conversation_id, "collection": collection,
                     "principals": sorted(set(principals))})).first()
                if owned is None:
                    conversation_id = None  # someone else's conversation: log the query alone
            await conn.execute(text(
                "INSERT INTO queries (id, conversation_id, collection, question, resolved_question, intent, route, "
                "guardrails, outcome) VALUES (:id, :cid, :collection, :question, :resolved, :intent, :route, "
                ":guardrails, :outcome)").bindparams(*json_params),
                {"id": query_id, "cid": conversation_id, "collection": collection, "question": question,
                 "resolved": resolved_question, "intent": intent, "route": route, "guardrails": guardrails,
                 "outcome": outcome})
            if answer is not None:
                await conn.execute(text(
                    "INSERT INTO answers (id, query_id, text, short_answer, citations, confidence, generator, model, "
                    "prompt_name, prompt_version, timings_ms) VALUES (:id, :qid, :text, :short, :citations, "
                    ":confidence, :generator, :model, :prompt_name, :prompt_version, :timings)").bindparams(
                        bindparam("citations", type_=JSONB), bindparam("timings", type_=JSONB)),
                    {"id": uuid.uuid4(), "qid": query_id, **answer})
            if conversation_id is not None:
                await conn.execute(text(
                    "INSERT INTO conversation_turns (conversation_id, query_id, question, subject, answer) "
                    "VALUES (:cid, :qid, :question, :subject, :answer)"),
                    {"cid": conversation_id, "qid": query_id, "question": resolved_question or question,
                     "subject": subject, "answer": (answer or {}).get("text")})
