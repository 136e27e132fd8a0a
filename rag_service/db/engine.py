"""Where the database is, and the engines that talk to it.

``resolve_database_url`` is the one place that decides between an external PostgreSQL
(``RAGSVC_DATABASE_URL``) and the embedded default.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from sqlalchemy import Engine, create_engine, make_url, text
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from rag_service.config import Settings
from rag_service.db.embedded import DATABASE_NAME, start_embedded
from rag_service.errors import (
    DatabaseTimeoutError,
    DatabaseUnavailableError,
    InvalidInputError,
    StorageFullError,
    StorageNotWritableError,
)
from rag_service.redaction import hide_password


def resolve_database_url(settings: Settings) -> str:
    """The SQLAlchemy URL to use; starts (or attaches to) the embedded server when none is set."""
    if settings.database_url:
        return settings.database_url
    return start_embedded(settings.data_dir, wait_s=settings.embedded_start_wait_s).url_for(DATABASE_NAME)


def libpq_conninfo(url: str) -> str:
    """A libpq key=value string for a SQLAlchemy URL (for clients other than SQLAlchemy)."""
    parsed = make_url(url)
    params = {"host": parsed.host, "port": parsed.port, "user": parsed.username, "password": parsed.password,
              "dbname": parsed.database, **{k: v for k, v in parsed.query.items() if isinstance(v, str)}}
    return psycopg.conninfo.make_conninfo(**{k: v for k, v in params.items() if v not in (None, "")})


# PostgreSQL's reasons when it cannot write a file (errno texts, in every server message about a file).
_STORAGE_REASON = re.compile(r'could not [^"\n]*"[^"\n]*"[^:\n]*: (No space left on device|Read-only file system|'
                             r"Permission denied|Disk quota exceeded)")


def embedded_pgdata(settings: Settings) -> Path | None:
    """Where the embedded server keeps its files (None with an external database)."""
    return settings.data_dir.expanduser().resolve() / "pg" if settings.embedded_database else None


def storage_error(exc: BaseException, display_url: str, pgdata: Path | None = None) -> StorageNotWritableError | None:
    """The service error for PostgreSQL failing to write its files (disk full, read-only file
    system, permissions), or None. Storage errors carry no SQLSTATE of their own (a read-only file
    system is 42501, like a missing grant, and a failed connection has none): the server's
    message names the file and the reason."""
    orig = getattr(exc, "orig", None) or exc
    text = str(orig)
    found = _STORAGE_REASON.search(text)
    full = getattr(orig, "sqlstate", None) == "53100" or (found is not None and found.group(1) in (
        "No space left on device", "Disk quota exceeded"))
    if found is None and not full:
        return None
    reason = found.group(0) if found else text.splitlines()[0]
    where = (f"the embedded database's data dir {pgdata}" if pgdata is not None
             else f"the data directory (or tablespace) of the PostgreSQL server at {display_url}")
    if full:
        return StorageFullError(f"the database's disk is full ({reason}); what was being written was not saved. "
                                f"Free disk space for {where}, then retry.")
    return StorageNotWritableError(f"the database cannot write its files ({reason}); what was being written was "
                                   f"not saved. Make {where} writable again (a file system remounted read-only "
                                   "after disk errors needs checking first), then retry.")


def translate_db_error(exc: Exception, display_url: str, pgdata: Path | None = None) -> Exception:
    """The service error for a database exception (SQLAlchemy's, or psycopg's where a raw
    connection is used), or the exception itself when it is a bug."""
    if (storage := storage_error(exc, display_url, pgdata)) is not None:
        return storage
    orig = getattr(exc, "orig", None) if isinstance(exc, DBAPIError) else exc
    if isinstance(orig, psycopg.errors.QueryCanceled):
        return DatabaseTimeoutError(f"the database query was cancelled after its time limit: {orig}")
    if isinstance(exc, OperationalError | psycopg.OperationalError):
        return DatabaseUnavailableError(f"cannot reach PostgreSQL at {display_url}: {orig or exc}")
    if isinstance(exc, IntegrityError | DataError):
        return InvalidInputError(f"the database refused the data: {str(orig or exc).splitlines()[0]}")
    return exc


def _connect_args(settings: Settings) -> dict[str, object]:
    return {"options": f"-c statement_timeout={settings.db_statement_timeout_ms}"}


def make_sync_engine(url: str, settings: Settings) -> Engine:
    return create_engine(url, connect_args=_connect_args(settings), pool_pre_ping=True)


@dataclass
class Database:
    """The async engine and session factory of one process."""

    url: str
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    pgdata: Path | None = None  # the embedded server's data, named in storage errors

    @classmethod
    def from_settings(cls, settings: Settings, url: str | None = None) -> Database:
        url = url or resolve_database_url(settings)
        engine = create_async_engine(
            url,
            pool_size=settings.db_pool_size,
            max_overflow=settings.db_max_overflow,
            pool_pre_ping=True,
            connect_args=_connect_args(settings),
        )
        return cls(url=url, engine=engine, sessions=async_sessionmaker(engine, expire_on_commit=False),
                   pgdata=embedded_pgdata(settings))

    @property
    def display_url(self) -> str:
        return hide_password(self.url)

    def translate(self, exc: Exception) -> Exception:
        """The service error for an exception from this database (or the exception itself)."""
        return translate_db_error(exc, self.display_url, self.pgdata)

    @contextmanager
    def _translated(self) -> Iterator[None]:
        try:
            yield
        except (DBAPIError, psycopg.Error) as exc:  # psycopg's own from raw connections (COPY)
            translated = self.translate(exc)
            if translated is exc:
                raise
            raise translated from exc

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[AsyncConnection]:
        """A connection (reads); database errors are translated to service errors."""
        with self._translated():
            async with self.engine.connect() as conn:
                yield conn

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[AsyncConnection]:
        """A connection in a transaction committed on success (writes); errors translated."""
        with self._translated():
            async with self.engine.begin() as conn:
                yield conn

    @asynccontextmanager
    async def session(self) -> AsyncIterator[AsyncSession]:
        """An ORM session (reads); errors translated."""
        with self._translated():
            async with self.sessions() as session:
                yield session

    async def ping(self) -> None:
        async with self.connect() as conn:
            await conn.execute(text("SELECT 1"))

    async def dispose(self) -> None:
        await self.engine.dispose()
