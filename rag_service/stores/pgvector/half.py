"""An optional half-precision HNSW index (pgvector 0.7+): ``(embedding::halfvec(dim))`` with
``halfvec_cosine_ops``, beside the full-precision index. The table keeps its full-precision
vectors, so scores and the exact scan use them; only the walk through the graph is in half
precision. Measured at 1,000,000 chunks on pgvector 0.8.5 (docs/benchmarks.md, "Half-precision
HNSW"): 1,116 MB against 1,953 MB, recall@10 0.955 against 0.965 at ef_search 100.

Built by ``ragsvc db half-index`` (minutes at a million chunks, so not at start-up), used with
``RAGSVC_VECTOR_INDEX=half``; PostgreSQL keeps it up to date on every write, like the full one."""

from __future__ import annotations

import re
import time
from typing import Any

import numpy as np
from pgvector.sqlalchemy import HALFVEC
from sqlalchemy import cast, literal, text
from sqlalchemy.sql.elements import ColumnElement

from rag_service.db.engine import Database
from rag_service.db.models import Chunk
from rag_service.errors import ConfigError

HALF_INDEX = "ix_chunks_embedding_hnsw_half"
FULL_INDEX = "ix_chunks_embedding_hnsw"
MIN_PGVECTOR = (0, 7)


def half_distance(vector: np.ndarray, dim: int) -> ColumnElement[Any]:
    """Cosine distance in half precision, written as the index's expression so the planner uses it."""
    query = cast(literal(vector.tolist(), HALFVEC(dim)), HALFVEC(dim))
    return cast(Chunk.embedding, HALFVEC(dim)).cosine_distance(query)


def require_half_support(pgvector_version: tuple[int, ...]) -> None:
    if pgvector_version < MIN_PGVECTOR:
        have = ".".join(map(str, pgvector_version))
        raise ConfigError(f"a half-precision index needs pgvector 0.7 or later; this server has {have} "
                          "(the embedded server's pgvector is 0.6.2: point RAGSVC_DATABASE_URL at a newer one)")


async def half_index_exists(db: Database) -> bool:
    async with db.connect() as conn:
        return (await conn.execute(text("SELECT 1 FROM pg_indexes WHERE indexname = :i"), {"i": HALF_INDEX})
                ).first() is not None


async def build_half_index(db: Database, dim: int, *, maintenance_work_mem: str = "1GB",
                           parallel_workers: int | None = None) -> float | None:
    """Build the half-precision index with the full one's HNSW parameters (m, ef_construction);
    the seconds it took, or None when it already exists. ``parallel_workers``: PostgreSQL's
    max_parallel_maintenance_workers for the build (default: the server's)."""
    async with db.engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        if (await conn.execute(text("SELECT 1 FROM pg_indexes WHERE indexname = :i"), {"i": HALF_INDEX})).first():
            return None
        definition = (await conn.execute(text("SELECT indexdef FROM pg_indexes WHERE indexname = :i"),
                                         {"i": FULL_INDEX})).scalar_one_or_none() or ""
        params = re.search(r"WITH \((.*)\)", definition)
        if not re.fullmatch(r"\d+\s*[kMG]?B", maintenance_work_mem):
            raise ConfigError(f"maintenance_work_mem must look like 512MB or 4GB, not {maintenance_work_mem!r}")
        await conn.execute(text("SET statement_timeout = 0"))  # the service's bound is for queries
        await conn.execute(text(f"SET maintenance_work_mem = '{maintenance_work_mem}'"))
        if parallel_workers is not None:
            await conn.execute(text(f"SET max_parallel_maintenance_workers = {int(parallel_workers)}"))
        started = time.perf_counter()
        await conn.execute(text(
            f"CREATE INDEX {HALF_INDEX} ON chunks USING hnsw ((embedding::halfvec({int(dim)})) halfvec_cosine_ops)"
            + (f" WITH ({params.group(1)})" if params else "")))
        await conn.execute(text("ANALYZE chunks"))
        return time.perf_counter() - started


async def drop_half_index(db: Database) -> bool:
    """Drop the half-precision index; whether there was one."""
    async with db.engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        existed = (await conn.execute(text("SELECT 1 FROM pg_indexes WHERE indexname = :i"), {"i": HALF_INDEX})
                   ).first() is not None
        await conn.execute(text(f"DROP INDEX IF EXISTS {HALF_INDEX}"))
        return existed
