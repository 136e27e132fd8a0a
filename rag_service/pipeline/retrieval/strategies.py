"""Retrieval strategies: one small class each behind the ``RetrievalStrategy`` Protocol.

Every strategy goes through the store adapter, so scoping (collection, ACL principals,
metadata) is applied inside the store's SQL, never after it. A strategy that has nothing to do
for a query (no identifiers for ``pattern``, no structured constraint for ``metadata``) returns
no hits rather than noise, so fusing it in costs nothing. A strategy whose capability the store
lacks (keyword, metadata or pattern search) fails each search with a clear reason, which the
retriever records while the other strategies go on: the pipeline degrades, it does not change.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeVar, runtime_checkable

import numpy as np

from rag_service.config import Settings
from rag_service.domain import SearchFilter, SearchHit
from rag_service.domain.strategies import add_strategy_name, remove_strategy_name, strategy_names
from rag_service.errors import InvalidInputError, MissingCapabilityError, PatternTooCommonError, RagServiceError
from rag_service.pipeline.retrieval.query_analysis import PatternSpec, extract_patterns
from rag_service.stores.base import KeywordQueryKeys, KeywordSearch, MetadataSearch, PatternSearch, VectorStore

Capability = TypeVar("Capability")
ChunkCounter = Callable[[str | None], Awaitable[int]]


def _capability(store: VectorStore, protocol: type[Capability], strategy: str) -> Capability:
    if not isinstance(store, protocol):
        raise MissingCapabilityError(f"the store {type(store).__name__} has no {protocol.__name__}; "
                                     f"the {strategy} strategy is skipped", stage=strategy)
    return store


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

    def __init__(self, store: VectorStore, *, exact_below: int = 0, count_chunks: ChunkCounter | None = None) -> None:
        if exact_below < 0:
            raise ValueError("exact_below must be >= 0 (0 = always use the index)")
        if exact_below and count_chunks is None:
            raise ValueError("exact_below needs count_chunks (how many chunks a collection holds)")
        self._store = store
        self._exact_below = exact_below
        self._count_chunks = count_chunks

    async def search(self, query: StrategyQuery) -> list[SearchHit]:
        if query.embedding is None:
            raise ValueError("the semantic strategy needs the query embedding")
        exact = self._count_chunks is not None and self._exact_below > 0 and (
            await self._count_chunks(query.filter.collection) < self._exact_below
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
        store = _capability(self._store, KeywordSearch, self.name)
        query.detail["scoring"] = self._scoring
        if self._scoring == "bm25":
            return await store.keyword_search(query.text, query.filter, query.top_k, k1=self._k1, b=self._b)
        return await store.text_search(query.text, query.filter, query.top_k)

    async def query_keys(self, texts: Sequence[str]) -> list[Hashable] | None:
        """Keys under which two texts ask for the same words (BM25 on a store that can tell; see
        ``KeywordQueryKeys``), else None."""
        if self._scoring != "bm25" or not isinstance(self._store, KeywordQueryKeys):
            return None
        return await self._store.keyword_query_keys(texts)


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
        store = _capability(self._store, MetadataSearch, self.name)
        query.detail["order"] = self._order
        if self._order == "relevance":
            if not isinstance(self._store, KeywordSearch):
                query.detail["order"] = "newest (the store has no keyword search)"
            else:
                hits = await self._store.keyword_search(query.text, query.filter, query.top_k, k1=self._k1,
                                                        b=self._b)
                if hits:
                    return hits
                query.detail["order"] = "newest (no query term matched)"
        order = "oldest" if self._order == "oldest" else "newest"
        return await store.metadata_search(query.filter, query.top_k, order=order)


class PatternStrategy:
    """Exact identifiers (E-4012, ABC-123, #4521, snake_case names) and "quoted phrases" from the
    query. Chunks matching more of the patterns rank first, then by occurrences. Each pattern is
    narrowed through the full-text index first and bounded by the store's pattern timeout.

    A pattern found in more than ``max_matches`` chunks is left out, and the report says so: its
    ranking would read every match (at 1,000,000 chunks "IL-6" is in 18,011 of them, and the search
    ran into the 2 s timeout), and the keyword strategy already ranks by the same words."""

    name = "pattern"
    needs_embedding = False

    def __init__(self, store: VectorStore, max_matches: int | None = None) -> None:
        self._store = store
        self._max_matches = max_matches

    async def search(self, query: StrategyQuery) -> list[SearchHit]:
        specs = extract_patterns(query.text)
        query.detail["patterns"] = [s.text for s in specs]
        if not specs:
            return []
        store = _capability(self._store, PatternSearch, self.name)
        results = await asyncio.gather(*[self._one(store, spec, query) for spec in specs])
        common = [spec.text for spec, result in zip(specs, results, strict=True) if result is None]
        if common:
            query.detail["too_common"] = common
        matched: dict[object, int] = {}
        occurrences: dict[object, float] = {}
        hits: dict[object, SearchHit] = {}
        for result in results:
            for hit in result or ():
                hits.setdefault(hit.chunk_id, hit)
                matched[hit.chunk_id] = matched.get(hit.chunk_id, 0) + 1
                occurrences[hit.chunk_id] = occurrences.get(hit.chunk_id, 0.0) + hit.score
        order = sorted(hits, key=lambda c: (-matched[c], -occurrences[c], str(c)))
        # Score: patterns matched, with occurrences as a fraction for ties.
        return [
            hits[c].model_copy(update={"score": matched[c] + occurrences[c] / (1 + occurrences[c])})
            for c in order[: query.top_k]
        ]

    async def _one(self, store: PatternSearch, spec: PatternSpec, query: StrategyQuery) -> list[SearchHit] | None:
        """The pattern's hits; None when it is too common to rank."""
        # Identifiers are whole tokens, so the full-text index can narrow the scan first; a
        # quoted phrase may sit inside tokens the text parser splits differently (URLs, paths),
        # so it is matched on the text itself, bounded by the store's pattern timeout.
        prefilter = spec.text if spec.kind == "identifier" else None
        try:
            return await store.pattern_search(spec.pattern, query.filter, query.top_k, mode=spec.mode,
                                              prefilter=prefilter, max_matches=self._max_matches)
        except PatternTooCommonError:
            return None
        except InvalidInputError as exc:
            # The patterns were read from the question, not typed as patterns: a timeout or a
            # refused pattern is this strategy failing (recorded), not the caller's bad input.
            raise RagServiceError(f"pattern {spec.text!r}: {exc}", stage="pattern") from exc


@dataclass(frozen=True)
class StrategyContext:
    """What a strategy factory may build from: the store, the catalog's chunk counts, Settings."""

    store: VectorStore
    settings: Settings
    count_chunks: ChunkCounter | None = None


StrategyFactory = Callable[[StrategyContext], RetrievalStrategy]
_FACTORIES: dict[str, StrategyFactory] = {}


def register_strategy(name: str, factory: StrategyFactory, description: str | None = None) -> None:
    """Make a strategy available by name: the APIs, the router and Settings then accept it (tests
    that register one unregister it afterwards)."""
    add_strategy_name(name, description)
    _FACTORIES[name] = factory


def unregister_strategy(name: str) -> None:
    remove_strategy_name(name)
    _FACTORIES.pop(name, None)


def build_strategies(context: StrategyContext) -> dict[str, RetrievalStrategy]:
    missing = [n for n in strategy_names() if n not in _FACTORIES]
    if missing:
        raise ValueError(f"strategies {missing} are named but have no factory; register them with register_strategy")
    return {name: factory(context) for name, factory in _FACTORIES.items()}


register_strategy("semantic", lambda c: SemanticStrategy(c.store, exact_below=c.settings.semantic_exact_below,
                                                         count_chunks=c.count_chunks))
register_strategy("keyword", lambda c: KeywordStrategy(c.store, scoring=c.settings.keyword_scoring,
                                                       k1=c.settings.bm25_k1, b=c.settings.bm25_b))
register_strategy("metadata", lambda c: MetadataStrategy(c.store, order=c.settings.metadata_order,
                                                         k1=c.settings.bm25_k1, b=c.settings.bm25_b))
register_strategy("pattern", lambda c: PatternStrategy(c.store, max_matches=c.settings.pattern_max_matches))
