"""An optional half-precision HNSW index (pgvector 0.7+): ``(embedding::halfvec(dim))`` with
``halfvec_cosine_ops``, beside the full-precision index. The table keeps its full-precision
vectors, so scores and the exact scan use them; only the walk through the graph is in half
precision. Measured at 1,000,000 chunks on pgvector 0.8.5 (docs/benchmarks.md, "Half-precision
HNSW"): 1,116 MB against 1,953 MB, with recall@10 (0.966 against 0.965) and latency (p95 12.4
against 12.2 ms) as the full index's at ef_search 100.

Built by ``ragsvc db half-index`` (minutes at a million chunks, so not at start-up; concurrently,
so writes go on meanwhile) and searched with ``RAGSVC_VECTOR_INDEX=half``; PostgreSQL keeps it up
to date on every write, like the full one."""

from __future__ import annotations

import re
import time
from typing import Any

import numpy as np
from pgvector.sqlalchemy import HALFVEC
from sqlalchemy import cast, literal, text
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from rag_service.db.engine import Database
from rag_service.db.models import Chunk
from rag_service.errors import ConfigError

HALF_INDEX = "ix_chunks_embedding_hnsw_half"
MIN_PGVECTOR = (0, 7)
_MEMORY = re.compile(r"[1-9]\d*\s*(MB|GB)")


def half_distance(vector: np.ndarray, dim: int) -> ColumnElement[Any]:
    """Cosine distance in half precision, written as the index's expression so the planner uses it."""
    # An explicit CAST of the parameter: psycopg would otherwise send the list untyped.
    query = cast(literal(vector.tolist(), HALFVEC(dim)), HALFVEC(dim))
    return cast(Chunk.embedding, HALFVEC(dim)).cosine_distance(query)


def require_half_support(pgvector_version: tuple[int, ...]) -> None:
    if pgvector_version < MIN_PGVECTOR:
        have = ".".join(map(str, pgvector_version))
        raise ConfigError(f"a half-precision index needs pgvector 0.7 or later; this server has {have} "
                          "(the embedded server's pgvector is 0.6.2: point RAGSVC_DATABASE_URL at a newer one)")


def check_memory(maintenance_work_mem: str) -> str:
    if not _MEMORY.fullmatch(maintenance_work_mem):
        raise ConfigError(f"maintenance_work_mem must look like 512MB or 4GB, not {maintenance_work_mem!r}")
    return maintenance_work_mem


async def half_index_state(conn: AsyncConnection) -> bool | None:
    """True: the half-precision index is there and valid; False: a build that failed left it
    invalid (a concurrent build does); None: there is none."""
    row = (await conn.execute(text("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:i)"),
                              {"i": HALF_INDEX})).first()
    return None if row is None else bool(row[0])


async def build_half_index(db: Database, dim: int, *, m: int, ef_construction: int,
                           maintenance_work_mem: str = "1GB", parallel_workers: int | None = None) -> float | None:
    """Build the half-precision index (concurrently: writes are not blocked); the seconds it
    took, or None when a valid one exists. ``parallel_workers``: PostgreSQL's
    max_parallel_maintenance_workers for the build (default: the server's)."""
    check_memory(maintenance_work_mem)
    async with db.connect() as plain:
        conn = await plain.execution_options(isolation_level="AUTOCOMMIT")  # CONCURRENTLY needs it
        state = await half_index_state(conn)
        if state:
            return None
        try:
            if state is False:
                await conn.execute(text(f"DROP INDEX CONCURRENTLY IF EXISTS {HALF_INDEX}"))
            await conn.execute(text("SET statement_timeout = 0"))  # the service's bound is for queries
            await conn.execute(text(f"SET maintenance_work_mem = '{maintenance_work_mem}'"))
            if parallel_workers is not None:
                await conn.execute(text(f"SET max_parallel_maintenance_workers = {int(parallel_workers)}"))
            started = time.perf_counter()
            await conn.execute(text(
                f"CREATE INDEX CONCURRENTLY {HALF_INDEX} ON chunks USING hnsw "
                f"((embedding::halfvec({int(dim)})) halfvec_cosine_ops) "
                f"WITH (m = {int(m)}, ef_construction = {int(ef_construction)})"))
            await conn.execute(text("ANALYZE chunks"))
            return time.perf_counter() - started
        finally:
            # The pooled connection goes back without the build's settings.
            await conn.execute(text("RESET statement_timeout; RESET maintenance_work_mem; "
                                    "RESET max_parallel_maintenance_workers"))


async def drop_half_index(db: Database) -> bool:
    """Drop the half-precision index (concurrently: searches are not blocked); whether there was one."""
    async with db.connect() as plain:
        conn = await plain.execution_options(isolation_level="AUTOCOMMIT")
        existed = await half_index_state(conn) is not None
        await conn.execute(text(f"DROP INDEX CONCURRENTLY IF EXISTS {HALF_INDEX}"))
        return existed
