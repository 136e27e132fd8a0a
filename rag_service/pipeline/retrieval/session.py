"""One retrieve() call's searches: embed each query once, run the strategies concurrently (those that
need no embedding without waiting for it), record what each did, and fall back from semantic to
keyword search when the semantic leg fails.

A later pass does not search again for what an earlier one already has: a rewritten query whose
BM25 terms are the question's own (two in three of the rule-based rewrites on SciFact: the
dropped words are stopwords to PostgreSQL too; and rewrites that only split hyphenated words, whose
parts PostgreSQL already reads) reuses the question's keyword results."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from rag_service.domain import Candidate, Iteration, SearchFilter, SearchHit, StrategyReport
from rag_service.errors import (
    DatabaseTimeoutError,
    DatabaseUnavailableError,
    InvalidInputError,
    RetrievalUnavailableError,
)
from rag_service.pipeline.retrieval.fusion import RankedList
from rag_service.pipeline.retrieval.strategies import RetrievalStrategy, StrategyQuery
from rag_service.providers.embeddings import Embedder

log = logging.getLogger(__name__)


class SearchSession:
    """State of one retrieve() call: embeddings made so far, strategies that ran, their reports."""

    def __init__(self, strategies: Mapping[str, RetrievalStrategy], embedder: Embedder, names: Sequence[str]) -> None:
        self._strategies = strategies
        self._embedder = embedder
        self.names = list(names)
        self.embeddings: dict[str, np.ndarray] = {}
        self.ran: set[str] = set()
        self.reports: list[StrategyReport] = []
        self.embed_error: str | None = None
        self.failures: list[Exception] = []
        self._hits: dict[tuple[str, str, str, int], list[SearchHit]] = {}  # (strategy, text, filter, depth)

    async def _embed(self, queries: Sequence[str]) -> None:
        todo = [q for q in dict.fromkeys(queries) if q not in self.embeddings]
        if not todo or self.embed_error:
            return
        try:
            vectors = await self._embedder.embed(todo)
            self.embeddings.update(zip(todo, vectors, strict=True))  # a wrong count of vectors fails here
        except Exception as exc:  # the semantic leg fails; the others go on (and keyword stands in)
            self.embed_error = f"embedding the query failed: {type(exc).__name__}: {exc}"
            log.warning(self.embed_error)

    async def search(self, queries: Sequence[str], flt: SearchFilter, depth: int,
                     weight_factor: float, only: Sequence[str] | None = None) -> list[RankedList]:
        names = [n for n in self.names if only is None or n in only] or list(only or [])
        strategies = [self._strategies[n] for n in names if n in self._strategies]
        # Only the semantic leg needs the query's embedding: the others start at once rather than
        # wait for the embedder (a few ms locally, tens over the network).
        embedded = (asyncio.ensure_future(self._embed(queries)) if any(s.needs_embedding for s in strategies)
                    else None)
        jobs = [(s, q) for q in queries for s in strategies]
        try:
            same = await self._same_results(strategies, queries, flt, depth)

            async def one(strategy: RetrievalStrategy, text: str) -> list[SearchHit] | None:
                if (strategy.name, text) in same:
                    return await self._reuse(strategy, text, flt, depth, same[(strategy.name, text)])
                if strategy.needs_embedding and embedded is not None:
                    await embedded
                return await self._run(strategy, text, flt, depth)

            results = await asyncio.gather(*[one(s, q) for s, q in jobs])
        finally:
            # Nothing awaited it: a strategy raised, the search was cancelled (the adaptive loop's
            # time budget), or every semantic result was reused from an earlier pass.
            if embedded is not None and not embedded.done():
                embedded.cancel()
        lists = [RankedList(s.name, hits, weight_factor) for (s, _), hits in zip(jobs, results, strict=True)
                 if hits is not None]
        failed = {s.name for (s, _), hits in zip(jobs, results, strict=True) if hits is None}
        if "semantic" in failed and "keyword" not in names and "keyword" in self._strategies:
            # The design's fallback: semantic search down -> keyword search.
            keyword = self._strategies["keyword"]
            fallback = await asyncio.gather(*[self._run(keyword, q, flt, depth, fallback=True) for q in queries])
            lists += [RankedList("keyword", hits, weight_factor) for hits in fallback if hits is not None]
        if not lists and failed:
            # A database outage is reported as such (503/504, retried by the orchestrator).
            for error in self.failures:
                if isinstance(error, DatabaseUnavailableError | DatabaseTimeoutError):
                    raise error
            errors = "; ".join(f"{r.strategy}: {r.error}" for r in self.reports if r.error)
            raise RetrievalUnavailableError(f"every retrieval strategy failed ({errors})", stage="retrieval")
        return lists

    async def _same_results(self, strategies: Sequence[RetrievalStrategy], queries: Sequence[str],
                            flt: SearchFilter, depth: int) -> dict[tuple[str, str], str]:
        """(strategy, query) -> an earlier query of this session that asks for the same words, whose
        results it reuses, for strategies that can tell (``query_keys``); one round trip per such
        strategy, and only once something was searched before."""
        scope = flt.model_dump_json()
        same: dict[tuple[str, str], str] = {}
        for strategy in strategies:
            keys_of = getattr(strategy, "query_keys", None)
            earlier = [t for (name, t, f, d) in self._hits if (name, f, d) == (strategy.name, scope, depth)]
            new = [q for q in dict.fromkeys(queries) if q not in earlier]
            same.update({(strategy.name, q): q for q in queries if q in earlier})
            if keys_of is None or not earlier or not new:
                continue
            try:
                keys = await keys_of(earlier + new)
                if keys is None:
                    continue
                first: dict[Hashable, str] = {}
                for text, key in zip(earlier, keys, strict=False):
                    first.setdefault(key, text)
                for text, key in zip(new, keys[len(earlier):], strict=True):
                    if key in first:
                        same[(strategy.name, text)] = first[key]
            except Exception as exc:  # only a saving: without keys every query is searched
                log.warning("strategy %s could not compare queries: %s", strategy.name, exc)
        return same

    async def _reuse(self, strategy: RetrievalStrategy, text: str, flt: SearchFilter, depth: int,
                     source: str) -> list[SearchHit]:
        hits = self._hits[(strategy.name, source, flt.model_dump_json(), depth)]
        self.ran.add(strategy.name)
        self.reports.append(StrategyReport(strategy=strategy.name, query=text, hits=len(hits), elapsed_ms=0.0,
                                           detail={"same_results_as": source}))
        return hits

    async def _run(self, strategy: RetrievalStrategy, text: str, flt: SearchFilter, depth: int,
                   fallback: bool = False) -> list[SearchHit] | None:
        """The strategy's hits, or None when it failed (recorded). Bad input is the caller's
        to fix, so it propagates as a 4xx instead of being swallowed."""
        started = time.perf_counter()
        query = StrategyQuery(text=text, filter=flt, top_k=depth, embedding=self.embeddings.get(text))
        if fallback:
            query.detail["fallback_for"] = "semantic"
        error = None
        hits: list[SearchHit] | None
        if strategy.needs_embedding and query.embedding is None:
            hits, error = None, self.embed_error or "no query embedding"
        else:
            try:
                hits = await strategy.search(query)
            except InvalidInputError:
                raise
            except Exception as exc:
                self.failures.append(exc)
                hits, error = None, f"{type(exc).__name__}: {exc}"
                log.warning("strategy %s failed: %s", strategy.name, error)
        if hits is not None:
            self.ran.add(strategy.name)
            if not fallback:
                self._hits[(strategy.name, text, flt.model_dump_json(), depth)] = hits
        self.reports.append(StrategyReport(
            strategy=strategy.name, query=text, hits=len(hits or []), error=error, detail=query.detail,
            elapsed_ms=(time.perf_counter() - started) * 1000,
        ))
        return hits

    def iteration(self, number: int, thought: str, action: str, queries: list[str], depth: int,
                  relaxed_now: bool, candidates: list[Candidate], confidence: float | None) -> Iteration:
        reports, self.reports = self.reports, []
        return Iteration(number=number, thought=thought, action=action, queries=queries, top_k=depth,
                         filter_relaxed=relaxed_now, strategies=reports, results=len(candidates),
                         confidence=round(confidence, 4) if confidence is not None else None,
                         elapsed_ms=sum(r.elapsed_ms for r in reports))
