"""The VectorStore adapter: the one interface the pipeline and ingestion use for chunk storage.

pgvector is the first implementation. A second store (Qdrant, Weaviate, ...) implements the same
Protocol and proves it by inheriting ``tests/stores/contract.py::VectorStoreContract``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

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

    async def vector_search(self, embedding: Sequence[float], flt: SearchFilter, top_k: int) -> list[SearchHit]:
        """Nearest chunks by cosine similarity (score = 1 - cosine distance)."""
        ...

    async def text_search(self, query: str, flt: SearchFilter, top_k: int) -> list[SearchHit]:
        """Full-text match (web-search syntax: quotes, OR, -exclusions), best first."""
        ...

    async def metadata_search(
        self, flt: SearchFilter, top_k: int, order: RecencyOrder = "newest"
    ) -> list[SearchHit]:
        """Chunks matching only the structured filter, ordered by document date."""
        ...

    async def pattern_search(
        self, pattern: str, flt: SearchFilter, top_k: int, mode: PatternMode = "literal",
        case_sensitive: bool = False,
    ) -> list[SearchHit]:
        """Chunks containing a literal string or matching a (validated, time-bounded) regex;
        score = number of occurrences."""
        ...

    async def counts(self) -> StoreCounts: ...
