"""The VectorStore adapter: the one interface the pipeline and ingestion use for chunk storage.

pgvector is the first implementation. A second store (Qdrant, Weaviate, ...) implements the same
Protocol and proves it by inheriting ``tests/stores/contract.py::VectorStoreContract``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import numpy as np

from rag_service.domain import ChunkRecord, DocumentRecord, SearchFilter, SearchHit

PatternMode = Literal["literal", "regex"]
RecencyOrder = Literal["newest", "oldest"]


@dataclass(frozen=True)
class StoreCounts:
    collections: int
    documents: int
    chunks: int
    embedded_chunks: int


@runtime_checkable
class VectorStore(Protocol):
    """Chunk storage and the four primitive searches. Every search applies ``SearchFilter``
    (collection, metadata, dates, LOB/tags, ACL principals) inside the store, never after it."""

    async def upsert_document(self, document: DocumentRecord) -> uuid.UUID:
        """Insert or update by (collection, source_uri); returns the stored document id."""
        ...

    async def upsert_chunks(self, chunks: Sequence[ChunkRecord]) -> int:
        """Insert or update chunks by id in bulk (idempotent); returns the number written."""
        ...

    async def replace_documents(self, items: Sequence[tuple[DocumentRecord, Sequence[ChunkRecord]]]) -> int:
        """Upsert the documents and swap each one's chunks for the given ones in one transaction,
        so every document is seen (and survives a crash) either entirely old or entirely new.
        Returns the number of chunks written."""
        ...

    async def delete_document(self, document_id: uuid.UUID) -> bool:
        """Delete a document and all its chunks; False when it did not exist."""
        ...

    async def vector_search(
        self, embedding: Sequence[float], flt: SearchFilter, top_k: int, *, exact: bool = False
    ) -> list[SearchHit]:
        """Nearest chunks by cosine similarity (score = 1 - cosine distance); ``exact`` skips the
        approximate index (worth it on small collections)."""
        ...

    async def text_search(self, query: str, flt: SearchFilter, top_k: int) -> list[SearchHit]:
        """Full-text match (web-search syntax: quotes, OR, -exclusions), best first."""
        ...

    async def keyword_search(
        self, query: str, flt: SearchFilter, top_k: int, *, k1: float = 1.2, b: float = 0.75
    ) -> list[SearchHit]:
        """Okapi BM25 over the query's terms (any term may match); quoted phrases and -exclusions
        in the query restrict the matches as in ``text_search``."""
        ...

    async def metadata_search(
        self, flt: SearchFilter, top_k: int, order: RecencyOrder = "newest"
    ) -> list[SearchHit]:
        """Chunks matching only the structured filter, ordered by document date."""
        ...

    async def pattern_search(
        self, pattern: str, flt: SearchFilter, top_k: int, mode: PatternMode = "literal",
        case_sensitive: bool = False, prefilter: str | None = None,
    ) -> list[SearchHit]:
        """Chunks containing a literal string or matching a (validated, time-bounded) regex;
        score = number of occurrences. ``prefilter`` is a phrase the chunk must also match in
        full text, which lets the store use its text index instead of scanning every chunk."""
        ...

    async def chunks_by_id(
        self, chunk_ids: Sequence[uuid.UUID], *, with_embeddings: bool = False
    ) -> dict[uuid.UUID, tuple[SearchHit, np.ndarray | None]]:
        """Stored chunks (parents included) by id, with embeddings when asked; unknown ids are absent."""
        ...

    async def embeddings_by_id(self, chunk_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, np.ndarray]:
        """Stored embeddings by chunk id; chunks without one (parents, unknown ids) are absent."""
        ...

    async def collection_exists(self, name: str) -> bool: ...

    async def searchable_chunks(self, collection: str | None) -> int:
        """How many searchable chunks a collection (or the whole store) holds; cheap to ask."""
        ...

    async def counts(self) -> StoreCounts: ...
