"""The store adapters: what the pipeline and ingestion need from chunk storage, split by capability.

``VectorStore`` is the core every store has: atomic writes, deletes, nearest-neighbour search and
reads by chunk id. The other Protocols are capabilities a store MAY have (``KeywordSearch``,
``MetadataSearch``, ``PatternSearch``). A second store (Qdrant, Weaviate, ...) implements
``VectorStore`` and whichever capabilities it has, and proves each by inheriting the matching
contract in ``tests/stores/``; the retriever degrades a strategy whose capability the store lacks
instead of failing the query. pgvector implements all four.

Every search applies ``SearchFilter`` (collection, metadata, dates, LOB/tags, ACL principals)
inside the store, never after it.
"""

from __future__ import annotations

import uuid
from collections.abc import Hashable, Sequence
from typing import Literal, Protocol, runtime_checkable

import numpy as np

from rag_service.domain import ChunkRecord, DocumentRecord, SearchFilter, SearchHit

PatternMode = Literal["literal", "regex"]
RecencyOrder = Literal["newest", "oldest"]


@runtime_checkable
class VectorStore(Protocol):
    """Chunk storage and nearest-neighbour search: what every store provides."""

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

    async def chunks_by_id(
        self, chunk_ids: Sequence[uuid.UUID], *, with_embeddings: bool = False
    ) -> dict[uuid.UUID, tuple[SearchHit, np.ndarray | None]]:
        """Stored chunks (parents included) by id, with embeddings when asked; unknown ids are absent."""
        ...

    async def similarities_by_id(
        self, chunk_ids: Sequence[uuid.UUID], embedding: Sequence[float]
    ) -> dict[uuid.UUID, float]:
        """Each chunk's cosine similarity to ``embedding`` (as ``vector_search`` scores it), by
        chunk id; chunks without an embedding (parents, unknown ids) are absent."""
        ...


@runtime_checkable
class KeywordSearch(Protocol):
    """Lexical search over the chunks' words: full text and BM25."""

    async def text_search(self, query: str, flt: SearchFilter, top_k: int) -> list[SearchHit]:
        """Full-text match (web-search syntax: quotes, OR, -exclusions), best first."""
        ...

    async def keyword_search(
        self, query: str, flt: SearchFilter, top_k: int, *, k1: float = 1.2, b: float = 0.75
    ) -> list[SearchHit]:
        """Okapi BM25 over the query's terms (any term may match); quoted phrases and -exclusions
        in the query restrict the matches as in ``text_search``."""
        ...


@runtime_checkable
class KeywordQueryKeys(Protocol):
    """What decides a BM25 query's results besides the filter and k: two texts with equal keys
    ask for the same words (the retriever then runs only one of them). Equal words give equal
    results. A store may also leave out of the key what adds only weight to words already in it
    (a hyphenated compound whose parts its tokenizer indexes too), and say so."""

    async def keyword_query_keys(self, texts: Sequence[str]) -> list[Hashable]:
        """One key per text, in order."""
        ...


@runtime_checkable
class MetadataSearch(Protocol):
    """Search by the structured filter alone, with no query text or vector."""

    async def metadata_search(
        self, flt: SearchFilter, top_k: int, order: RecencyOrder = "newest"
    ) -> list[SearchHit]:
        """Chunks matching only the structured filter, ordered by document date."""
        ...


@runtime_checkable
class PatternSearch(Protocol):
    """Exact-string and regex search over chunk text (identifiers, error codes)."""

    async def pattern_search(
        self, pattern: str, flt: SearchFilter, top_k: int, mode: PatternMode = "literal",
        case_sensitive: bool = False, prefilter: str | None = None, max_matches: int | None = None,
    ) -> list[SearchHit]:
        """Chunks containing a literal string or matching a (validated, time-bounded) regex;
        score = number of occurrences. ``prefilter`` is a phrase the chunk must also match in
        full text, which lets the store use its text index instead of scanning every chunk.
        With ``max_matches``, a pattern found in more chunks than that raises
        PatternTooCommonError after reading one more than it: ranking by occurrences reads every
        match, so without the bound a common pattern costs in proportion to the collection."""
        ...
