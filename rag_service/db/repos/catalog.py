"""The document catalog: collections, what is stored per document (for ingestion bookkeeping and
the documents API) and how much. Always PostgreSQL, whichever VectorStore holds the vectors."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
from sqlalchemy import Select, Text, cast, delete, func, select, text
from sqlalchemy.dialects.postgresql import ARRAY

from rag_service.db.engine import Database
from rag_service.db.models import Chunk, Collection, Document
from rag_service.db.repos.answers import forget_documents
from rag_service.db.tenancy import in_scope
from rag_service.domain import (
    CollectionSummary,
    DocumentState,
    DocumentSummary,
    StoreCounts,
    StoredChunk,
    TenantScope,
)

# A collection that exists is remembered this long: collections are created far more rarely than
# they are searched, and every query checks one.
KNOWN_COLLECTION_TTL_S = 5.0


class DocumentCatalog:
    def __init__(self, db: Database) -> None:
        self._db = db
        self._known_collections: dict[str, float] = {}

    async def collection_exists(self, name: str) -> bool:
        """Whether the collection exists; a yes is remembered for a few seconds."""
        now = time.monotonic()
        if self._known_collections.get(name, 0.0) > now:
            return True
        async with self._db.connect() as conn:
            found = (await conn.execute(select(Collection.id).where(Collection.name == name))).first() is not None
        if found:
            self._known_collections[name] = now + KNOWN_COLLECTION_TTL_S
        return found

    async def collections(self, principals: Sequence[str] | None = None,
                          scope: TenantScope | None = None) -> list[CollectionSummary]:
        """The collections in ``scope`` (None: every tenant's) by name, with how many of their
        documents ``principals`` may read (all of them with None), counted as ``list`` would."""
        documents = func.count(Document.id)
        if principals is not None:
            documents = documents.filter(Document.acl.overlap(cast(["*", *principals], ARRAY(Text))))
        stmt = (
            select(Collection.name, Collection.description, Collection.created_at, documents.label("documents"))
            .outerjoin(Document, Document.collection_id == Collection.id).where(in_scope(Collection.name, scope))
            .group_by(Collection.id).order_by(Collection.name)
        )
        async with self._db.connect() as conn:
            rows = (await conn.execute(stmt)).all()
        return [CollectionSummary(name=r.name, description=r.description, documents=r.documents,
                                  created_at=r.created_at) for r in rows]

    async def searchable_chunks(self, collection: str | None) -> int:
        """Searchable (embedded) chunks in a collection, or in all: the few statistics rows kept by
        triggers (appended deltas, folded after writes), summed."""
        stmt = text(
            "SELECT coalesce(sum(chunk_count), 0) FROM keyword_stats WHERE collection_id IN "
            "(SELECT id FROM collections" + (" WHERE name = :name)" if collection is not None else ")")
        )
        async with self._db.connect() as conn:
            params = {"name": collection} if collection is not None else {}
            return int((await conn.execute(stmt, params)).scalar_one())

    async def counts(self) -> StoreCounts:
        async with self._db.connect() as conn:
            row = (await conn.execute(text(
                "SELECT (SELECT count(*) FROM collections), (SELECT count(*) FROM documents), "
                "(SELECT count(*) FROM chunks), (SELECT count(*) FROM chunks WHERE embedding IS NOT NULL)"
            ))).one()
        collections, documents, chunks, embedded = map(int, row)
        return StoreCounts(collections=collections, documents=documents, chunks=chunks, embedded_chunks=embedded)

    async def states(self, collection: str, source_uris: Sequence[str]) -> dict[str, DocumentState]:
        if not source_uris:
            return {}
        stmt = (
            select(Document.source_uri, Document.id, Document.content_hash, Document.version)
            .join(Collection, Collection.id == Document.collection_id)
            .where(Collection.name == collection, Document.source_uri.in_(list(source_uris)))
        )
        async with self._db.connect() as conn:
            rows = (await conn.execute(stmt)).all()
        return {r.source_uri: DocumentState(id=r.id, content_hash=r.content_hash, version=r.version) for r in rows}

    async def vectors_by_hash(self, document_ids: Sequence[uuid.UUID]) -> dict[str, np.ndarray]:
        """Stored embeddings of these documents' chunks, by chunk content hash (for reuse)."""
        if not document_ids:
            return {}
        stmt = select(Chunk.content_hash, Chunk.embedding).where(
            Chunk.document_id.in_(list(document_ids)), Chunk.embedding.is_not(None)
        )
        async with self._db.connect() as conn:
            rows = (await conn.execute(stmt)).all()
        return {r.content_hash: np.asarray(r.embedding, dtype=np.float32) for r in rows}

    @staticmethod
    def _summary_select() -> Select[Any]:
        chunk_count = (
            select(func.count()).select_from(Chunk).where(Chunk.document_id == Document.id).scalar_subquery()
        )
        return select(Document, Collection.name.label("collection"), chunk_count.label("chunk_count")).join(
            Collection, Collection.id == Document.collection_id
        )

    @staticmethod
    def _summary(row: Any) -> DocumentSummary:
        d: Document = row.Document
        acl = [] if d.acl == ["*"] else list(d.acl)
        return DocumentSummary(
            id=d.id, collection=row.collection, source_uri=d.source_uri, title=d.title, version=d.version,
            content_hash=d.content_hash, metadata=d.metadata_ or {}, acl=acl, lob=d.lob, tags=list(d.tags or []),
            effective_date=d.effective_date, created_at=d.created_at, updated_at=d.updated_at,
            chunk_count=row.chunk_count,
        )

    async def list(
        self, collection: str | None = None, *, limit: int = 50, offset: int = 0,
        principals: Sequence[str] | None = None, scope: TenantScope | None = None,
    ) -> tuple[list[DocumentSummary], int]:
        """Documents of one collection (its key) or of every collection in ``scope`` (None: all),
        most recently updated first; with ``principals``, only those whose ACL grants one of them
        (public documents carry "*", as in the store)."""
        stmt = self._summary_select().where(in_scope(Collection.name, scope))
        count = (select(func.count()).select_from(Document)
                 .join(Collection, Collection.id == Document.collection_id).where(in_scope(Collection.name, scope)))
        if principals is not None:
            granted = Document.acl.overlap(cast(["*", *principals], ARRAY(Text)))
            stmt, count = stmt.where(granted), count.where(granted)
        if collection is not None:
            stmt, count = stmt.where(Collection.name == collection), count.where(Collection.name == collection)
        stmt = stmt.order_by(Document.updated_at.desc(), Document.id).limit(limit).offset(offset)
        async with self._db.session() as session:
            rows = (await session.execute(stmt)).all()
            total = (await session.execute(count)).scalar_one()
        return [self._summary(r) for r in rows], total

    async def get(self, document_id: uuid.UUID) -> tuple[DocumentSummary, list[StoredChunk]] | None:
        async with self._db.session() as session:
            row = (await session.execute(self._summary_select().where(Document.id == document_id))).first()
            if row is None:
                return None
            chunks = (await session.execute(
                select(Chunk.id, Chunk.parent_id, Chunk.ordinal, Chunk.text, Chunk.start_char, Chunk.end_char,
                       Chunk.token_count, Chunk.metadata_.label("chunk_metadata"),
                       Chunk.embedding.is_not(None).label("embedded"))
                .where(Chunk.document_id == document_id).order_by(Chunk.ordinal)
            )).all()
        return self._summary(row), [
            StoredChunk(id=c.id, parent_id=c.parent_id, ordinal=c.ordinal, text=c.text, start_char=c.start_char,
                        end_char=c.end_char, token_count=c.token_count, metadata=c.chunk_metadata or {},
                        embedded=c.embedded)
            for c in chunks
        ]

    async def delete_missing(self, collection: str, keep_uris: set[str]) -> list[str]:
        """Delete the collection's documents whose source URI is not in ``keep_uris`` (prune); the
        answers citing them forget them in the same transaction (``forget_documents``)."""
        async with self._db.begin() as conn:
            rows = (await conn.execute(
                select(Document.id, Document.source_uri).join(Collection, Collection.id == Document.collection_id)
                .where(Collection.name == collection)
            )).all()
            doomed = [r for r in rows if r.source_uri not in keep_uris]
            if doomed:
                await forget_documents(conn, [r.id for r in doomed])
                await conn.execute(delete(Document).where(Document.id.in_([r.id for r in doomed])))
        return sorted(r.source_uri for r in doomed)
