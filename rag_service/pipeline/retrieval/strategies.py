"""Retrieval strategies: one small class each behind the ``RetrievalStrategy`` Protocol.

Every strategy goes through the ``VectorStore`` adapter, so scoping (collection, ACL principals,
metadata) is applied inside the store's SQL, never after it. A strategy that has nothing to do
for a query (no identifiers for ``pattern``, no structured constraint for ``metadata``) returns
no hits rather than noise, so fusing it in costs nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

import numpy as np

from rag_service.domain import SearchFilter, SearchHit
from rag_service.errors import InvalidInputError, RagServiceError
from rag_service.pipeline.retrieval.query_analysis import PatternSpec, extract_patterns
from rag_service.stores.base import VectorStore

if TYPE_CHECKING:
    from rag_service.config import Settings


@dataclass(frozen=True)
class StrategyQuery:
    """What a strategy needs: the text, its embedding (when a strategy needs one), the scope."""

    text: str
    filter: SearchFilter
    top_k: int
    embedding: np.ndarray | None = None
    detail: dict[str, object] = field(default_factory=dict)  # strategies note what they did here


@runtime_checkable
class RetrievalStrategy(Protocol):
    name: str
    needs_embedding: bool

    async def search(self, query: StrategyQuery) -> list[SearchHit]:
        """Hits best first, at most ``query.top_k``."""
        ...


def has_structured_constraint(flt: SearchFilter) -> bool:
    """True when the filter says more than collection and caller (what the metadata strategy needs)."""
    return bool(flt.metadata_equals or flt.metadata_in or flt.metadata_range or flt.date_from or flt.date_to
                or flt.lob or flt.tags_any)


class SemanticStrategy:
    """Cosine nearest neighbours. The HNSW index answers in roughly constant time; below
    ``exact_below`` chunks an exact scan is as fast and has perfect recall."""

    name = "semantic"
    needs_embedding = True

    def __init__(self, store: VectorStore, *, exact_below: int = 0) -> None:
        if exact_below < 0:
            raise ValueError("exact_below must be >= 0 (0 = always use the index)")
        self._store = store
        self._exact_below = exact_below

    async def search(self, query: StrategyQuery) -> list[SearchHit]:
        if query.embedding is None:
            raise ValueError("the semantic strategy needs the query embedding")
        exact = bool(self._exact_below) and (
            await self._store.searchable_chunks(query.filter.collection) < self._exact_below
        )
        query.detail["exact"] = exact
        return await self._store.vector_search(query.embedding.tolist(), query.filter, query.top_k, exact=exact)


class KeywordStrategy:
    """Full-text search scored with Okapi BM25 (default) or PostgreSQL's ts_rank_cd."""

    name = "keyword"
    needs_embedding = False

    def __init__(self, store: VectorStore, *, scoring: Literal["bm25", "ts_rank_cd"] = "bm25",
                 k1: float = 1.2, b: float = 0.75) -> None:
        if scoring not in ("bm25", "ts_rank_cd"):
            raise ValueError("scoring must be 'bm25' or 'ts_rank_cd'")
        if k1 < 0 or not 0 <= b <= 1:
            raise ValueError("BM25 needs k1 >= 0 and 0 <= b <= 1")
        self._store = store
        self._scoring = scoring
        self._k1 = k1
        self._b = b

    async def search(self, query: StrategyQuery) -> list[SearchHit]:
        query.detail["scoring"] = self._scoring
        if self._scoring == "bm25":
            return await self._store.keyword_search(query.text, query.filter, query.top_k, k1=self._k1, b=self._b)
        return await self._store.text_search(query.text, query.filter, query.top_k)


class MetadataStrategy:
    """Chunks selected by structured constraints alone (tags, LOB, dates, metadata keys), newest
    first, oldest first, or by BM25 relevance to the query within the constrained set."""

    name = "metadata"
    needs_embedding = False

    def __init__(self, store: VectorStore, *, order: Literal["newest", "oldest", "relevance"] = "newest",
                 k1: float = 1.2, b: float = 0.75) -> None:
        if order not in ("newest", "oldest", "relevance"):
            raise ValueError("order must be 'newest', 'oldest' or 'relevance'")
        self._store = store
        self._order = order
        self._k1 = k1
        self._b = b

    async def search(self, query: StrategyQuery) -> list[SearchHit]:
        if not has_structured_constraint(query.filter):
            query.detail["skipped"] = "no structured constraint in the filter"
            return []
        query.detail["order"] = self._order
        if self._order == "relevance":
            hits = await self._store.keyword_search(query.text, query.filter, query.top_k, k1=self._k1, b=self._b)
            if hits:
                return hits
            query.detail["order"] = "newest (no query term matched)"
        order = "oldest" if self._order == "oldest" else "newest"
        return await self._store.metadata_search(query.filter, query.top_k, order=order)


class PatternStrategy:
    """Exact identifiers (E-4012, ABC-123, #4521, snake_case names) and "quoted phrases" from the
    query. Chunks matching more of the patterns rank first, then by occurrences. Each pattern is
    narrowed through the full-text index first and bounded by the store's pattern timeout."""

    name = "pattern"
    needs_embedding = False

    def __init__(self, store: VectorStore) -> None:
        self._store = store

    async def search(self, query: StrategyQuery) -> list[SearchHit]:
        specs = extract_patterns(query.text)
        query.detail["patterns"] = [s.text for s in specs]
        if not specs:
            return []
        results = await asyncio.gather(*[self._one(spec, query) for spec in specs])
        matched: dict[object, int] = {}
        occurrences: dict[object, float] = {}
        hits: dict[object, SearchHit] = {}
        for result in results:
            for hit in result:
                hits.setdefault(hit.chunk_id, hit)
                matched[hit.chunk_id] = matched.get(hit.chunk_id, 0) + 1
                occurrences[hit.chunk_id] = occurrences.get(hit.chunk_id, 0.0) + hit.score
        order = sorted(hits, key=lambda c: (-matched[c], -occurrences[c], str(c)))
        # Score: patterns matched, with occurrences as a fraction for ties.
        return [
            hits[c].model_copy(update={"score": matched[c] + occurrences[c] / (1 + occurrences[c])})
            for c in order[: query.top_k]
        ]

    async def _one(self, spec: PatternSpec, query: StrategyQuery) -> list[SearchHit]:
        # Identifiers are whole tokens, so the full-text index can narrow the scan first; a
        # quoted phrase may sit inside tokens the text parser splits differently (URLs, paths),
        # so it is matched on the text itself, bounded by the store's pattern timeout.
        prefilter = spec.text if spec.kind == "identifier" else None
        try:
            return await self._store.pattern_search(spec.pattern, query.filter, query.top_k, mode=spec.mode,
                                                    prefilter=prefilter)
        except InvalidInputError as exc:
            # The patterns were read from the question, not typed as patterns: a timeout or a
            # refused pattern is this strategy failing (recorded), not the caller's bad input.
            raise RagServiceError(f"pattern {spec.text!r}: {exc}", stage="pattern") from exc


# A factory builds a strategy from the store and the Settings (the one place knobs are read).
StrategyFactory = Callable[[VectorStore, "Settings"], RetrievalStrategy]
_REGISTRY: dict[str, StrategyFactory] = {}


def register_strategy(name: str, factory: StrategyFactory) -> None:
    """Make a strategy available by name (tests that register one unregister it afterwards)."""
    _REGISTRY[name] = factory


def unregister_strategy(name: str) -> None:
    _REGISTRY.pop(name, None)


def build_strategies(store: VectorStore, settings: Settings) -> dict[str, RetrievalStrategy]:
    return {name: factory(store, settings) for name, factory in _REGISTRY.items()}


register_strategy("semantic", lambda store, s: SemanticStrategy(store, exact_below=s.semantic_exact_below))
register_strategy("keyword", lambda store, s: KeywordStrategy(store, scoring=s.keyword_scoring, k1=s.bm25_k1,
                                                              b=s.bm25_b))
register_strategy("metadata", lambda store, s: MetadataStrategy(store, order=s.metadata_order, k1=s.bm25_k1,
                                                                b=s.bm25_b))
register_strategy("pattern", lambda store, s: PatternStrategy(store))
