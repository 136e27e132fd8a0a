"""Fixtures for retrieval tests: a store on the module's database, loaded with the contract corpus."""

from __future__ import annotations

import uuid

import pytest

from rag_service.domain import ChunkRecord, DocumentRecord
from rag_service.stores.pgvector import PgVectorStore
from tests.stores.contract import CORPUS, Doc


@pytest.fixture(scope="module")
async def store(database) -> PgVectorStore:
    return PgVectorStore(database)


@pytest.fixture(scope="module")
async def corpus(store: PgVectorStore, local_embedder) -> dict[uuid.UUID, Doc]:
    by_id: dict[uuid.UUID, Doc] = {}
    for doc in CORPUS:
        doc_id = await store.upsert_document(DocumentRecord(
            collection=doc.collection, source_uri=f"test://{doc.key}", title=doc.key.title(), content_hash=doc.key,
            metadata=doc.metadata, acl=doc.acl, lob=doc.lob, tags=doc.tags, effective_date=doc.effective))
        vectors = await local_embedder.embed(doc.texts)
        await store.upsert_chunks([
            ChunkRecord(document_id=doc_id, ordinal=i, text=t, start_char=0, end_char=len(t),
                        token_count=len(t.split()), content_hash=f"{doc.key}-{i}", embedding=v.tolist())
            for i, (t, v) in enumerate(zip(doc.texts, vectors, strict=True))
        ])
        by_id[doc_id] = doc
    return by_id
