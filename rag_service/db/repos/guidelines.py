"""The router's guidelines, stored as versions; the newest is current."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.expression import bindparam

from rag_service.db.engine import Database
from rag_service.domain import GuidelineSet


class GuidelineRepository:
    """The shipped defaults (``defaults``, read on first use) become version 1. Reads are cached
    for ``ttl_s`` so a query does not cost a round trip; a PUT through this process is seen at
    once, through another process within the TTL."""

    def __init__(self, db: Database, defaults: Callable[[], GuidelineSet], ttl_s: float = 5.0) -> None:
        self._db = db
        self._defaults = defaults
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
            found = await self._seed()
        else:
            found = (row.version, GuidelineSet.model_validate(row.document))
        self._cached = (now, *found)
        return found

    async def _seed(self) -> tuple[int, GuidelineSet]:
        async with self._db.begin() as conn:
            # Serialise concurrent first uses so only one of them writes version 1.
            await conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('guideline_sets seed'))"))
            row = (await conn.execute(text(
                "SELECT version, document FROM guideline_sets ORDER BY version DESC LIMIT 1"))).first()
            if row is not None:
                return row.version, GuidelineSet.model_validate(row.document)
            defaults = self._defaults()
            return await self._insert(conn, defaults, "shipped defaults", "system"), defaults

    async def put(self, guidelines: GuidelineSet, comment: str | None, author: str | None) -> int:
        async with self._db.begin() as conn:
            version = await self._insert(conn, guidelines, comment, author)
        self._cached = (time.monotonic(), version, guidelines)
        return version

    @staticmethod
    async def _insert(conn: AsyncConnection, guidelines: GuidelineSet, comment: str | None,
                      author: str | None) -> int:
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
