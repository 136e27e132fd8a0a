"""Writes to the pgvector store: documents by (collection, source_uri), chunks in bulk.

Chunks go through binary COPY into a temporary table and one INSERT ... ON CONFLICT, so a batch
is a handful of round trips whatever its size; integrity (documents exist, parents exist) is
checked on the temporary table before anything reaches ``chunks``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np
from psycopg.types.json import Jsonb
from sqlalchemy import delete, func, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from rag_service.db.models import Chunk, Collection, Document
from rag_service.db.values import strip_nul
from rag_service.domain import ChunkRecord, DocumentRecord
from rag_service.errors import InvalidInputError
from rag_service.stores.pgvector.connection import PgStoreBase
from rag_service.stores.pgvector.filters import PUBLIC_PRINCIPAL

log = logging.getLogger(__name__)

# Given the open transaction and the ids of the documents about to be deleted.
BeforeDelete = Callable[[AsyncConnection, Sequence[uuid.UUID]], Awaitable[None]]

_CHUNK_COLUMNS = (
    "id", "document_id", "parent_id", "ordinal", "text", "start_char", "end_char",
    "token_count", "content_hash", "metadata", "embedding",
)
_CHUNK_TYPES = ("uuid", "uuid", "uuid", "int4", "text", "int4", "int4", "int4", "text", "jsonb", "vector")


class PgWrites(PgStoreBase):
    """Document and chunk writes; every public method is one transaction."""

    async def upsert_document(self, document: DocumentRecord) -> uuid.UUID:
        async with self._db.begin() as conn:
            return (await self._upsert_documents(conn, [document]))[0]

    async def _upsert_documents(self, conn: AsyncConnection, documents: Sequence[DocumentRecord]) -> list[uuid.UUID]:
        """Insert or update documents by (collection, source_uri) in one statement; their stored ids."""
        collections: dict[str, int] = {}
        for name in dict.fromkeys(d.collection for d in documents):
            collections[name] = await self._ensure_collection(conn, name)
        rows = [
            {
                "id": d.id, "collection_id": collections[d.collection], "source_uri": d.source_uri,
                "title": strip_nul(d.title), "content_hash": d.content_hash, "version": d.version,
                "metadata": strip_nul(d.metadata), "acl": list(d.acl) or [PUBLIC_PRINCIPAL], "lob": d.lob,
                "tags": list(d.tags), "effective_date": d.effective_date,
            }
            for d in documents
        ]
        keys = {(r["collection_id"], r["source_uri"]) for r in rows}
        if len(keys) != len(rows):
            raise InvalidInputError("a batch names the same source_uri twice in one collection")
        table = Document.__table__
        stored: dict[tuple[int, str], uuid.UUID] = {}
        for start in range(0, len(rows), 1000):  # PostgreSQL takes at most 65,535 parameters
            stmt = insert(table).values(rows[start:start + 1000])
            updated = {k: stmt.excluded[k] for k in rows[0] if k not in ("id", "collection_id", "source_uri")}
            stmt = stmt.on_conflict_do_update(
                constraint="uq_documents_collection_source", set_={**updated, "updated_at": func.now()},
            ).returning(table.c.id, table.c.collection_id, table.c.source_uri)
            stored.update({(r.collection_id, r.source_uri): r.id for r in await conn.execute(stmt)})
        return [stored[(r["collection_id"], r["source_uri"])] for r in rows]

    async def _ensure_collection(self, conn: AsyncConnection, name: str) -> int:
        await conn.execute(insert(Collection).values(name=name).on_conflict_do_nothing(index_elements=["name"]))
        return (await conn.execute(select(Collection.id).where(Collection.name == name))).scalar_one()

    async def upsert_chunks(self, chunks: Sequence[ChunkRecord]) -> int:
        if not chunks:
            return 0
        async with self._db.begin() as conn:
            written = await self._write_chunks(conn, chunks)
        await self.fold_keyword_deltas()
        return written

    async def fold_keyword_deltas(self) -> None:
        """Fold the keyword statistics' delta rows that writers appended (migrations 0011, 0012) into
        one row per collection. Writers never wait for it, and readers sum the rows, so a fold that
        fails or is skipped (another is running) costs read speed only."""
        try:
            async with self._db.begin() as conn:
                await conn.execute(text(
                    "SELECT keyword_fold(c) FROM (SELECT collection_id AS c FROM keyword_stats "
                    "GROUP BY collection_id HAVING count(*) > 1) x WHERE c IN (SELECT id FROM collections)"))
        except Exception as exc:  # the write has committed: a fold that fails must not fail it
            log.warning("could not fold the keyword statistics (%s: %s); reads add the deltas meanwhile",
                        type(exc).__name__, exc)

    async def prune_keyword_changes(self, older_than_s: float = 86_400) -> int:
        """Delete the keyword change log below the newest mark at least ``older_than_s`` old, after
        adding a mark (the oldest running snapshot's xmin) for a later cleanup (migration 0014).
        A keyword index that has not read that far rebuilds instead of reading the rows."""
        async with self._db.begin() as conn:
            await conn.execute(text(
                "INSERT INTO keyword_changes_marks (below) VALUES (pg_snapshot_xmin(pg_current_snapshot()))"))
            mark = (await conn.execute(text(
                "SELECT at, below FROM keyword_changes_marks WHERE at < now() - make_interval(secs => :s) "
                "ORDER BY at DESC LIMIT 1"), {"s": older_than_s})).one_or_none()
            if mark is None:
                return 0
            at, xmin = mark
            deleted = await conn.execute(text("DELETE FROM keyword_changes WHERE xid < CAST(:x AS xid8)"),
                                         {"x": str(xmin)})
            await conn.execute(text("UPDATE keyword_changes_pruned SET below = greatest(below, CAST(:x AS xid8))"),
                               {"x": str(xmin)})
            await conn.execute(text("DELETE FROM keyword_changes_marks WHERE at < :at"), {"at": at})
        return deleted.rowcount or 0

    async def replace_documents(self, items: Sequence[tuple[DocumentRecord, Sequence[ChunkRecord]]]) -> int:
        """Upsert each document and swap its chunks for the given ones, all in one transaction:
        a reader (or a crash) sees every document either entirely old or entirely new."""
        if not items:
            return 0
        async with self._db.begin() as conn:
            stored_ids = await self._upsert_documents(conn, [document for document, _ in items])
            for (document, _), stored_id in zip(items, stored_ids, strict=True):
                if stored_id != document.id:
                    raise InvalidInputError(
                        f"{document.source_uri} is stored as document {stored_id}, not {document.id}; "
                        "replace it under its stored id"
                    )
            await conn.execute(delete(Chunk).where(Chunk.document_id.in_([d.id for d, _ in items])))
            written = await self._write_chunks(conn, [chunk for _, chunks in items for chunk in chunks])
        await self.fold_keyword_deltas()
        return written

    async def _write_chunks(self, conn: AsyncConnection, chunks: Sequence[ChunkRecord]) -> int:
        """Binary COPY into a temp table, then one INSERT ... ON CONFLICT, inside the caller's transaction."""
        if not chunks:
            return 0
        dim = (await self.schema()).embedding_dimension
        latest = {chunk.id: chunk for chunk in chunks}  # one row per id, or ON CONFLICT refuses the batch
        rows = [self._copy_row(chunk, dim) for chunk in latest.values()]
        columns = ", ".join(_CHUNK_COLUMNS)
        updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in _CHUNK_COLUMNS if c != "id")
        raw = await self._raw_with_vector(conn)
        async with raw.cursor() as cur:
            await cur.execute(
                "CREATE TEMP TABLE _chunks_in (LIKE chunks INCLUDING DEFAULTS) ON COMMIT DROP;"
                "ALTER TABLE _chunks_in ALTER COLUMN collection_id DROP NOT NULL"
            )
            async with cur.copy(f"COPY _chunks_in ({columns}) FROM STDIN WITH (FORMAT BINARY)") as copy:
                copy.set_types(list(_CHUNK_TYPES))
                for row in rows:
                    await copy.write_row(row)
            await cur.execute(
                "SELECT count(*) FROM _chunks_in t WHERE NOT EXISTS "
                "(SELECT 1 FROM documents d WHERE d.id = t.document_id)"
            )
            orphans = (await cur.fetchone())[0]
            await cur.execute(
                "SELECT count(*) FROM _chunks_in t WHERE t.parent_id IS NOT NULL "
                "AND NOT EXISTS (SELECT 1 FROM _chunks_in p WHERE p.id = t.parent_id) "
                "AND NOT EXISTS (SELECT 1 FROM chunks p WHERE p.id = t.parent_id)"
            )
            missing_parents = (await cur.fetchone())[0]
            if missing_parents:
                raise InvalidInputError(
                    f"{missing_parents} chunks name a parent_id that is neither in the batch nor stored"
                )
            if orphans:
                # Raising inside the transaction rolls the whole batch back.
                raise InvalidInputError(
                    f"{orphans} of {len(rows)} chunks reference documents that do not exist; "
                    "upsert the documents first"
                )
            await cur.execute(
                f"INSERT INTO chunks ({columns}, collection_id) "
                f"SELECT {', '.join('t.' + c for c in _CHUNK_COLUMNS)}, d.collection_id "
                "FROM _chunks_in t JOIN documents d ON d.id = t.document_id "
                f"ON CONFLICT (id) DO UPDATE SET {updates}, collection_id = EXCLUDED.collection_id"
            )
            written = cur.rowcount
            await cur.execute("DROP TABLE _chunks_in")  # a second call in the same transaction recreates it
            return written

    @staticmethod
    def _copy_row(chunk: ChunkRecord, dim: int) -> tuple[Any, ...]:
        embedding = None
        if chunk.embedding is not None:
            if len(chunk.embedding) != dim:
                raise InvalidInputError(
                    f"chunk {chunk.id} has a {len(chunk.embedding)}-d embedding; the store holds {dim}-d vectors"
                )
            embedding = np.asarray(chunk.embedding, dtype=np.float32)
        return (
            chunk.id, chunk.document_id, chunk.parent_id, chunk.ordinal, strip_nul(chunk.text),
            chunk.start_char, chunk.end_char, chunk.token_count, chunk.content_hash, Jsonb(strip_nul(chunk.metadata)),
            embedding,
        )

    async def delete_document(self, document_id: uuid.UUID, *, before_delete: BeforeDelete | None = None) -> bool:
        """``before_delete`` runs in the deleting transaction, before the rows go: what the caller
        keeps about the document elsewhere in the database goes with it, or nothing goes."""
        async with self._db.begin() as conn:
            if before_delete is not None:
                await before_delete(conn, [document_id])
            result = await conn.execute(delete(Document).where(Document.id == document_id))
        if result.rowcount:
            await self.fold_keyword_deltas()
        return result.rowcount > 0
