"""A store with only the core operations: the retriever runs what it can and records the
strategies whose capability the store lacks, instead of failing or changing shape."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import numpy as np

from rag_service.config import load_settings
from rag_service.domain import ChunkRecord, DocumentRecord, RetrievalRequest, SearchFilter, SearchHit
from rag_service.pipeline.retrieval.retriever import build_retriever
from rag_service.stores.base import KeywordSearch, MetadataSearch, PatternSearch, VectorStore
from tests.stores.contract import CORPUS


class MemoryStore:
    """The core protocol in memory: documents and chunks in dicts, exact cosine search."""

    def __init__(self) -> None:
        self.documents: dict[uuid.UUID, DocumentRecord] = {}
        self.chunks: dict[uuid.UUID, ChunkRecord] = {}

    async def replace_documents(self, items: Sequence[tuple[DocumentRecord, Sequence[ChunkRecord]]]) -> int:
        for document, chunks in items:
            await self.delete_document(document.id)
            self.documents[document.id] = document
            self.chunks.update({c.id: c for c in chunks})
        return sum(len(chunks) for _, chunks in items)

    async def delete_document(self, document_id: uuid.UUID) -> bool:
        self.chunks = {k: c for k, c in self.chunks.items() if c.document_id != document_id}
        return self.documents.pop(document_id, None) is not None

    async def vector_search(self, embedding: Sequence[float], flt: SearchFilter, top_k: int, *,
                            exact: bool = False) -> list[SearchHit]:
        granted = {"*", *flt.principals}
        visible = [c for c in self.chunks.values() if c.embedding is not None
                   and self.documents[c.document_id].collection == flt.collection
                   and flt.lob in (None, self.documents[c.document_id].lob)
                   and (not self.documents[c.document_id].acl or granted & set(self.documents[c.document_id].acl))]
        scored = sorted(visible, key=lambda c: -float(np.dot(c.embedding, embedding)))[:top_k]
        return [self._hit(c, float(np.dot(c.embedding, embedding))) for c in scored]

    async def chunks_by_id(self, chunk_ids: Sequence[uuid.UUID], *, with_embeddings: bool = False
                           ) -> dict[uuid.UUID, tuple[SearchHit, np.ndarray | None]]:
        return {i: (self._hit(self.chunks[i], 0.0), None) for i in chunk_ids if i in self.chunks}

    async def similarities_by_id(self, chunk_ids: Sequence[uuid.UUID],
                                 embedding: Sequence[float]) -> dict[uuid.UUID, float]:
        return {i: float(np.dot(self.chunks[i].embedding, embedding)) for i in chunk_ids
                if i in self.chunks and self.chunks[i].embedding is not None}

    def _hit(self, chunk: ChunkRecord, score: float) -> SearchHit:
        document = self.documents[chunk.document_id]
        return SearchHit(chunk_id=chunk.id, document_id=document.id, parent_id=chunk.parent_id, ordinal=chunk.ordinal,
                         source_uri=document.source_uri, title=document.title, text=chunk.text,
                         start_char=chunk.start_char, end_char=chunk.end_char, score=score)


async def test_strategies_a_store_cannot_run_degrade_and_the_rest_answer(local_embedder) -> None:
    store = MemoryStore()
    assert isinstance(store, VectorStore)
    assert not isinstance(store, KeywordSearch | MetadataSearch | PatternSearch)
    for doc in CORPUS:
        record = DocumentRecord(collection=doc.collection, source_uri=f"test://{doc.key}", content_hash=doc.key,
                                acl=doc.acl, title=doc.key, lob=doc.lob)
        vectors = await local_embedder.embed(doc.texts)
        await store.replace_documents([(record, [
            ChunkRecord(document_id=record.id, ordinal=i, text=t, start_char=0, end_char=len(t), token_count=1,
                        content_hash=f"{doc.key}-{i}", embedding=v.tolist())
            for i, (t, v) in enumerate(zip(doc.texts, vectors, strict=True))])])
    retriever = build_retriever(load_settings(reranker="local"), store, local_embedder)
    result = await retriever.retrieve(RetrievalRequest(query="bread flour yeast error E-4012",
                                                       filter=SearchFilter(collection="kb")))
    assert result.candidates and result.candidates[0].hit.source_uri == "test://bread"
    reports = {r.strategy: r for r in result.iterations[0].strategies}
    assert reports["semantic"].error is None and reports["semantic"].hits > 0
    assert "has no KeywordSearch" in reports["keyword"].error
    assert "has no PatternSearch" in reports["pattern"].error
    assert result.rerank is not None and result.rerank.applied  # the local reranker needs only the core
    # Access control still holds on the core path: the restricted merger document stays hidden.
    assert all(c.hit.source_uri != "test://merger" for c in result.candidates)
    # A structured filter asks for the metadata strategy, which this store cannot run either.
    scoped = await retriever.retrieve(RetrievalRequest(query="bread", filter=SearchFilter(collection="kb", lob="food")))
    assert {c.hit.source_uri for c in scoped.candidates} == {"test://bread"}
    metadata = next(r for r in scoped.iterations[0].strategies if r.strategy == "metadata")
    assert "has no MetadataSearch" in metadata.error
