"""One retrieve() call's searches: embed each query once, run the strategies concurrently, record
what each did, and fall back from semantic to keyword search when the semantic leg fails."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence

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

    async def _embed(self, queries: Sequence[str]) -> None:
        todo = [q for q in dict.fromkeys(queries) if q not in self.embeddings]
        if not todo or self.embed_error:
            return
        try:
            vectors = await self._embedder.embed(todo)
        except Exception as exc:  # the semantic leg fails; the others go on (and keyword stands in)
            self.embed_error = f"embedding the query failed: {type(exc).__name__}: {exc}"
            log.warning(self.embed_error)
            return
        self.embeddings.update(zip(todo, vectors, strict=True))

    async def search(self, queries: Sequence[str], flt: SearchFilter, depth: int,
                     weight_factor: float, only: Sequence[str] | None = None) -> list[RankedList]:
        names = [n for n in self.names if only is None or n in only] or list(only or [])
        strategies = [self._strategies[n] for n in names if n in self._strategies]
        if any(s.needs_embedding for s in strategies):
            await self._embed(queries)
        jobs = [(s, q) for q in queries for s in strategies]
        results = await asyncio.gather(*[self._run(s, q, flt, depth) for s, q in jobs])
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
