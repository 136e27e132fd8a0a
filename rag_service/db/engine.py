"""Where the database is, and the engines that talk to it.

``resolve_database_url`` is the one place that decides between an external PostgreSQL
(``RAGSVC_DATABASE_URL``) and the embedded default.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

import psycopg
from sqlalchemy import Engine, create_engine, make_url, text
from sqlalchemy.exc import DataError, IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from rag_service.config import Settings, hide_password
from rag_service.db.embedded import DATABASE_NAME, start_embedded
from rag_service.errors import DatabaseTimeoutError, DatabaseUnavailableError, InvalidInputError


def resolve_database_url(settings: Settings) -> str:
    """The SQLAlchemy URL to use; starts (or attaches to) the embedded server when none is set."""
    if settings.database_url:
        return settings.database_url
    return start_embedded(settings.data_dir).url_for(DATABASE_NAME)


def libpq_conninfo(url: str) -> str:
    """A libpq key=value string for a SQLAlchemy URL (for clients other than SQLAlchemy)."""
    parsed = make_url(url)
    params = {"host": parsed.host, "port": parsed.port, "user": parsed.username, "password": parsed.password,
              "dbname": parsed.database, **{k: v for k, v in parsed.query.items() if isinstance(v, str)}}
    return psycopg.conninfo.make_conninfo(**{k: v for k, v in params.items() if v not in (None, "")})


def translate_db_error(exc: Exception, display_url: str) -> Exception:
    """The service error for a database exception, or the exception itself when it is a bug."""
    orig = getattr(exc, "orig", None)
    if isinstance(orig, psycopg.errors.QueryCanceled):
        return DatabaseTimeoutError(f"the database query was cancelled after its time limit: {orig}")
    if isinstance(exc, OperationalError):
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
        return cls(url=url, engine=engine, sessions=async_sessionmaker(engine, expire_on_commit=False))

    @property
    def display_url(self) -> str:
        return hide_password(self.url)

    @contextmanager
    def _translated(self) -> Iterator[None]:
        try:
            yield
        except (OperationalError, IntegrityError, DataError) as exc:
            raise translate_db_error(exc, self.display_url) from exc

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
