"""What the database server itself reports: its version, pgvector's, and the schema revision."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text

from rag_service.db import migrate
from rag_service.db.engine import Database


@dataclass(frozen=True)
class ServerInfo:
    server_version: str
    pgvector_version: str | None
    schema_revision: str | None


class ServerInfoRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def info(self) -> ServerInfo:
        async with self._db.connect() as conn:
            pgvector = (await conn.execute(
                text("SELECT extversion FROM pg_extension WHERE extname = 'vector'"))).scalar_one_or_none()
            server_version = (await conn.execute(text("SHOW server_version"))).scalar_one()
            revision = await conn.run_sync(migrate.current_revision)
        return ServerInfo(server_version=server_version, pgvector_version=pgvector, schema_revision=revision)

    async def schema_revision(self) -> str | None:
        async with self._db.connect() as conn:
            return await conn.run_sync(migrate.current_revision)
