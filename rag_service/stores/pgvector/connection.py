"""What every part of the pgvector store shares: the database, the tuning knobs, the schema
parameters read once from the migration, and psycopg connections with pgvector's types."""

from __future__ import annotations

import functools
import logging
import math
import time
import weakref
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
from pgvector import Bit, HalfVector, SparseVector, Vector
from pgvector.psycopg.bit import BitBinaryDumper, BitDumper
from pgvector.psycopg.halfvec import HalfVectorBinaryDumper, HalfVectorBinaryLoader, HalfVectorDumper, HalfVectorLoader
from pgvector.psycopg.sparsevec import (
    SparseVectorBinaryDumper,
    SparseVectorBinaryLoader,
    SparseVectorDumper,
    SparseVectorLoader,
)
from pgvector.psycopg.vector import VectorBinaryDumper, VectorBinaryLoader, VectorDumper, VectorLoader
from psycopg.types import TypeInfo
from sqlalchemy import Select, text
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.elements import ClauseElement

from rag_service.db.engine import Database
from rag_service.errors import ConfigError, SchemaMismatchError
from rag_service.stores.pgvector.half import MIN_PGVECTOR, half_index_state, require_half_support
from rag_service.stores.pgvector.term_index import TermIndex

log = logging.getLogger(__name__)
HALF_RECHECK_S = 60.0


@dataclass(frozen=True)
class SchemaInfo:
    embedding_dimension: int
    text_search_config: str
    has_trgm: bool
    pgvector_version: tuple[int, ...] = (0,)

    @property
    def iterative_scans(self) -> bool:
        """pgvector 0.8 can continue an HNSW scan until the filters have let ``top_k`` rows through."""
        return self.pgvector_version >= (0, 8)

    @property
    def halfvec(self) -> bool:
        """pgvector 0.7 has half-precision vectors, and so the optional half-precision index."""
        return self.pgvector_version >= MIN_PGVECTOR


def parse_version(value: str | None) -> tuple[int, ...]:
    """'0.8.0' as (0, 8, 0); anything unreadable as (0,)."""
    try:
        return tuple(int(part) for part in (value or "").split("."))
    except ValueError:
        return (0,)


class Explain(Executable, ClauseElement):
    """``EXPLAIN <statement>``, with the statement's parameters bound as usual."""

    inherit_cache = False

    def __init__(self, statement: Select[Any]) -> None:
        self.statement = statement


@compiles(Explain, "postgresql")
def _compile_explain(element: Explain, compiler: Any, **kw: Any) -> str:
    return "EXPLAIN " + compiler.process(element.statement, **kw)


# pgvector's types as its register_vector_async registers them: (type name, the Python types dumped
# as it, dumpers, loaders), text before binary (the last one registered is the default).
_PGVECTOR_TYPES: tuple[tuple[str, tuple[type | str, ...], tuple[type, ...], tuple[type, ...]], ...] = (
    ("vector", (Vector, "numpy.ndarray"), (VectorDumper, VectorBinaryDumper), (VectorLoader, VectorBinaryLoader)),
    ("bit", (Bit,), (BitDumper, BitBinaryDumper), ()),
    ("halfvec", (HalfVector,), (HalfVectorDumper, HalfVectorBinaryDumper), (HalfVectorLoader, HalfVectorBinaryLoader)),
    ("sparsevec", (SparseVector,), (SparseVectorDumper, SparseVectorBinaryDumper),
     (SparseVectorLoader, SparseVectorBinaryLoader)),
)


@functools.cache
def _dumper(base: type, oid: int) -> type:
    """pgvector's dumper ``base`` carrying a database's oid for its type (COPY's set_types finds
    dumpers by oid): one class per (dumper, oid) for the life of the process."""
    return type("", (base,), {"oid": oid})


async def register_vector_types(raw: psycopg.AsyncConnection[Any]) -> None:
    """What pgvector's ``register_vector_async`` does, but without new classes on every call.

    pgvector makes new dumper classes for each connection it registers, and psycopg keeps every
    dumper class it is given in a process-wide dict (``AdaptersMap._optimised``) that is never
    emptied: each new connection kept 4 classes (about 11 KB; 8 with pgvector 0.7's halfvec and
    sparsevec) for good. The pool opens and closes its overflow connections all the time under
    load, so the server grew by megabytes a minute in the load benchmark (issue 14). Here the
    classes are made once per database (its oids)."""
    for name, python_types, dumpers, loaders in _PGVECTOR_TYPES:
        info = await TypeInfo.fetch(raw, name)
        if info is None:  # halfvec and sparsevec need pgvector 0.7
            if name == "vector":
                raise psycopg.ProgrammingError("vector type not found in the database")
            continue
        info.register(raw)
        for python_type in python_types:
            for base in dumpers:
                raw.adapters.register_dumper(python_type, _dumper(base, info.oid))
        for loader in loaders:
            raw.adapters.register_loader(info.oid, loader)


class PgStoreBase:
    """The state the write and search mixins share, and the helpers they all need."""

    def __init__(self, db: Database, *, ef_search: int = 40, pattern_timeout_ms: int = 2000,
                 term_index: TermIndex | None = None, vector_index: Literal["full", "half"] = "full") -> None:
        if ef_search < 1:
            raise ValueError("ef_search must be >= 1")
        if vector_index not in ("full", "half"):
            raise ValueError(f"vector_index must be 'full' or 'half', not {vector_index!r}")
        if pattern_timeout_ms < 1:
            raise ValueError("pattern_timeout_ms must be >= 1")
        self._db = db
        self._ef_search = ef_search
        self._pattern_timeout_ms = pattern_timeout_ms
        self._vector_index = vector_index  # which HNSW index nearest-neighbour search walks
        # Whether the half-precision index is there, re-read every HALF_RECHECK_S: built or dropped
        # while the service runs, it is picked up or left without a restart.
        self._half_ready = False
        self._half_checked_at = -math.inf
        self._term_index = term_index  # tantivy beside PostgreSQL for BM25 top k (None: SQL only)
        self._schema: SchemaInfo | None = None
        self._vector_registered: weakref.WeakSet[Any] = weakref.WeakSet()
        # How filtered nearest-neighbour searches were answered when HNSW alone fell short of
        # top_k: by a second index scan with a wider ef_search, by pgvector 0.8's iterative scan,
        # or by an exact scan.
        self.vector_widened = 0
        self.vector_iterative = 0
        self.vector_exact_fallbacks = 0

    @property
    def term_index(self) -> TermIndex | None:
        return self._term_index

    async def close(self) -> None:
        """Stop a keyword index build in progress (the next start resumes from scratch)."""
        if self._term_index is not None:
            await self._term_index.close()

    async def _raw_with_vector(self, conn: AsyncConnection) -> Any:
        """The psycopg connection under ``conn``, with pgvector's types registered once per
        connection (registering looks the type up in the catalog: a round trip each time)."""
        raw = (await conn.get_raw_connection()).driver_connection
        if raw not in self._vector_registered:
            await register_vector_types(raw)
            self._vector_registered.add(raw)
        return raw

    async def schema(self) -> SchemaInfo:
        """Parameters fixed by the migration (read once): vector dimension, text search config."""
        if self._schema is None:
            async with self._db.connect() as conn:
                try:
                    rows = dict((await conn.execute(text("SELECT key, value FROM schema_info"))).all())
                except ProgrammingError as exc:
                    raise SchemaMismatchError(
                        "the database has no rag-service schema; run `ragsvc db upgrade`"
                    ) from exc
                pgvector = (await conn.execute(text(
                    "SELECT extversion FROM pg_extension WHERE extname = 'vector'"))).scalar_one_or_none()
            self._schema = SchemaInfo(
                embedding_dimension=int(rows["embedding_dimension"]),
                text_search_config=rows["text_search_config"],
                has_trgm=rows.get("pg_trgm") == "yes",
                pgvector_version=parse_version(pgvector),
            )
        return self._schema

    async def check_vector_index(self) -> None:
        """For start-up: RAGSVC_VECTOR_INDEX=half needs pgvector 0.7+ and a valid half-precision index."""
        if self._vector_index != "half":
            return
        require_half_support((await self.schema()).pgvector_version)
        async with self._db.connect() as conn:
            if not await half_index_state(conn):
                raise ConfigError("RAGSVC_VECTOR_INDEX=half, but the database has no valid half-precision index: "
                                  "build it with `ragsvc db half-index`, or set RAGSVC_VECTOR_INDEX=full")

    async def _walk_half_index(self) -> bool:
        """Whether nearest-neighbour search should walk the half-precision index: configured, and
        there (checked at most every HALF_RECHECK_S). Configured but missing, search walks the full
        index, with a warning when that starts."""
        if self._vector_index != "half":
            return False
        now = time.monotonic()
        if now - self._half_checked_at >= HALF_RECHECK_S:
            async with self._db.connect() as conn:
                ready = bool(await half_index_state(conn))
            if not ready and (self._half_ready or math.isinf(self._half_checked_at)):
                log.warning("RAGSVC_VECTOR_INDEX=half, but there is no valid half-precision index: searching the "
                            "full-precision one (build it with `ragsvc db half-index`)")
            self._half_ready, self._half_checked_at = ready, now
        return self._half_ready

    async def explain(self, statement: Select[Any]) -> str:
        """PostgreSQL's plan for a search statement, as EXPLAIN prints it."""
        async with self._db.connect() as conn:
            await conn.execute(text(f"SET LOCAL hnsw.ef_search = {self._ef_search}"))
            return "\n".join(row[0] for row in await conn.execute(Explain(statement)))
