"""The Retriever: runs the requested strategies concurrently, fuses, adapts, reranks.

One call is a small ReAct loop. Iteration 1 searches with the query as given. While the fused
list's confidence is below the threshold, and iterations and time remain, it acts (relax the
filters, retrieve for each part of a multi-part question, add rewritten queries, search
deeper) and fuses what the action found with everything found before. Every iteration is
recorded for the trace. Reranking then orders the best fused candidates; a reranker that fails
or times out leaves the fused order and says so.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from rag_service.config import Settings
from rag_service.domain import Candidate, Iteration, RerankReport, RetrievalRequest, RetrievalResult
from rag_service.domain.strategies import BUILTIN_STRATEGIES
from rag_service.errors import InvalidInputError, RagServiceError
from rag_service.pipeline.retrieval.adaptive import LoopState, next_action, relaxed, retrieval_confidence
from rag_service.pipeline.retrieval.expansion import LLMQueryExpander
from rag_service.pipeline.retrieval.fusion import reciprocal_rank_fusion
from rag_service.pipeline.retrieval.query_analysis import query_variants, split_subqueries
from rag_service.pipeline.retrieval.session import SearchSession
from rag_service.pipeline.retrieval.strategies import (
    ChunkCounter,
    RetrievalStrategy,
    StrategyContext,
    build_strategies,
)
from rag_service.providers.embeddings import Embedder
from rag_service.providers.llm import LLM
from rag_service.providers.rerankers import CohereReranker, LocalReranker, Reranker
from rag_service.stores.base import VectorStore

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class RetrievalConfig:
    strategies: tuple[str, ...] = BUILTIN_STRATEGIES
    candidates: int = 100  # depth of each strategy's list
    rrf_k: float = 60.0
    weights: Mapping[str, float] = field(default_factory=lambda: {"semantic": 1.0, "keyword": 1.0})
    variant_weight: float = 0.5  # a rewritten query votes less than the question as asked
    rerank: bool = True
    rerank_top_n: int = 200
    rerank_timeout_s: float = 2.0
    adaptive: bool = True
    min_confidence: float = 0.5
    max_iterations: int = 3
    time_budget_ms: float = 400.0

    def __post_init__(self) -> None:
        if self.candidates < 1 or self.rerank_top_n < 1 or self.max_iterations < 1:
            raise ValueError("candidates, rerank_top_n and max_iterations must be >= 1")
        if not 0 <= self.min_confidence <= 1:
            raise ValueError("min_confidence must be in [0, 1]")


class Retriever:
    def __init__(self, store: VectorStore, embedder: Embedder, strategies: Mapping[str, RetrievalStrategy],
                 reranker: Reranker | None, config: RetrievalConfig,
                 expander: LLMQueryExpander | None = None) -> None:
        unknown = set(config.strategies) - set(strategies)
        if unknown:
            raise ValueError(f"default strategies {sorted(unknown)} are not available")
        self._store = store
        self._embedder = embedder
        self._strategies = dict(strategies)
        self._reranker = reranker
        self._expander = expander
        self.config = config

    @property
    def reranker_name(self) -> str:
        return self._reranker.name if self._reranker else "none"

    async def retrieve(self, request: RetrievalRequest) -> RetrievalResult:
        started = time.perf_counter()
        candidates, iterations, confidence, embedding = await self.fused_candidates(request)
        rerank_report = None
        use_reranker = self.config.rerank if request.rerank is None else request.rerank
        if use_reranker and self._reranker is not None and candidates:
            if embedding is None and self._reranker.needs_query_embedding:  # no semantic strategy ran
                embedding = (await self._embedder.embed([request.query]))[0]
            candidates, rerank_report = await self._rerank(request.query, embedding, candidates)
        top = candidates[: request.top_k]
        if request.expand_parents:
            top = await self._expand_parents(top)
        return RetrievalResult(candidates=top, iterations=iterations, rerank=rerank_report, confidence=confidence,
                               elapsed_ms=(time.perf_counter() - started) * 1000)

    async def fused_candidates(
        self, request: RetrievalRequest
    ) -> tuple[list[Candidate], list[Iteration], float | None, np.ndarray | None]:
        """Every fused candidate (not cut to top_k, not reranked), the loop's iterations, the
        final confidence and the query's embedding. ``retrieve`` builds on it; the local
        ranker's trainer uses it to see exactly what the reranker sees."""
        started = time.perf_counter()
        cfg = self.config
        names = list(request.strategies or cfg.strategies)
        missing = [n for n in names if n not in self._strategies]
        if missing:
            raise InvalidInputError(f"unknown strategies {missing}; available: {sorted(self._strategies)}")
        depth = max(request.candidates or cfg.candidates, request.top_k)
        adaptive = cfg.adaptive if request.adaptive is None else request.adaptive
        session = SearchSession(self._strategies, self._embedder, names)

        lists = await session.search([request.query], request.filter, depth, weight_factor=1.0)
        candidates = reciprocal_rank_fusion(lists, cfg.weights, cfg.rrf_k)
        confidence = retrieval_confidence(candidates, session.ran)
        iterations = [session.iteration(1, "first pass", "search", [request.query], depth, False, candidates,
                                        confidence)]
        all_lists = list(lists)
        flt = request.filter
        tried: set[str] = set()
        subqueries = tuple(split_subqueries(request.query))
        variants = tuple(query_variants(request.query))
        budget_s = cfg.time_budget_ms / 1000
        reranking = (cfg.rerank if request.rerank is None else request.rerank) and self._reranker is not None
        pool = max(cfg.rerank_top_n, request.top_k) if reranking else request.top_k  # what the ranking draws from

        def remaining() -> float:
            return budget_s - (time.perf_counter() - started)

        def weak() -> bool:
            # Nothing found is always worth acting on, whether or not the strategies can judge it.
            return not candidates or (confidence is not None and confidence < cfg.min_confidence)

        while adaptive and weak() and len(iterations) < cfg.max_iterations and remaining() > 0:
            policy = request.relax_filters
            relaxable = relaxed(flt) is not None and (
                policy == "when_few" or (policy == "when_empty" and not candidates))
            step = next_action(LoopState(len(candidates), request.top_k, relaxable, subqueries,
                                         variants, frozenset(tried), can_expand=self._expander is not None,
                                         pool_full=len(candidates) >= pool))
            if step is None:
                break
            action, thought = step
            tried.add(action)
            queries, factor, relaxed_now, only = [request.query], 1.0, False, None
            note = ""
            try:
                if action == "relax_filters":
                    flt, relaxed_now = relaxed(flt) or flt, True
                elif action == "decompose":
                    queries = list(subqueries)
                elif action == "rewrite":
                    queries, factor = list(variants), cfg.variant_weight
                    if self._expander is not None:
                        try:
                            llm_variants = await asyncio.wait_for(self._expander.variants(request.query), remaining())
                            queries = list(dict.fromkeys(queries + llm_variants))
                        except (RagServiceError, TimeoutError) as exc:
                            note = f" (LLM variants failed: {exc or 'timed out'}; rule-based ones only)"
                    if not queries:
                        continue
                elif action == "hyde":
                    assert self._expander is not None
                    passage = await asyncio.wait_for(self._expander.hypothetical_document(request.query),
                                                     remaining())
                    queries, factor, only = [passage], cfg.variant_weight, ["semantic"]
                elif action == "widen":
                    depth = min(depth * 2, 1000)
                new = await asyncio.wait_for(session.search(queries, flt, depth, weight_factor=factor, only=only),
                                             remaining())
            except TimeoutError:
                iterations.append(session.iteration(len(iterations) + 1, thought + " (ran out of time)", action,
                                                    queries, depth, relaxed_now, candidates, confidence))
                break
            except RagServiceError as exc:
                if isinstance(exc, InvalidInputError):
                    raise
                iterations.append(session.iteration(len(iterations) + 1, f"{thought} (failed: {exc})", action,
                                                    queries, depth, relaxed_now, candidates, confidence))
                continue
            all_lists.extend(new)
            candidates = reciprocal_rank_fusion(all_lists, cfg.weights, cfg.rrf_k)
            confidence = retrieval_confidence(candidates, session.ran)
            iterations.append(session.iteration(len(iterations) + 1, thought + note, action, queries, depth,
                                                relaxed_now, candidates, confidence))

        return candidates, iterations, confidence, session.embeddings.get(request.query)

    async def _rerank(self, query: str, embedding: np.ndarray | None,
                      candidates: list[Candidate]) -> tuple[list[Candidate], RerankReport]:
        assert self._reranker is not None
        head, tail = candidates[: self.config.rerank_top_n], candidates[self.config.rerank_top_n:]
        started = time.perf_counter()
        report = RerankReport(reranker=self._reranker.name, applied=False, candidates=len(head))
        try:
            scores = await asyncio.wait_for(self._reranker.rerank(query, embedding, head),
                                            self.config.rerank_timeout_s)
            if len(scores) != len(head):
                raise RagServiceError(f"reranker returned {len(scores)} scores for {len(head)} candidates")
        except TimeoutError:
            report.error = f"timed out after {self.config.rerank_timeout_s} s; kept the fused order"
        except Exception as exc:  # any reranker failure degrades to the fused order, recorded
            report.error = f"{type(exc).__name__}: {exc}; kept the fused order"
            log.warning("reranker %s failed: %s", self._reranker.name, exc)
        else:
            order = sorted(range(len(head)), key=lambda i: (-scores[i], i))
            head = [head[i].model_copy(update={"rerank_score": float(scores[i])}) for i in order]
            report.applied = True
        report.elapsed_ms = (time.perf_counter() - started) * 1000
        return head + tail, report

    async def _expand_parents(self, candidates: list[Candidate]) -> list[Candidate]:
        parent_ids = list({c.hit.parent_id for c in candidates if c.hit.parent_id is not None})
        if not parent_ids:
            return candidates
        parents = await self._store.chunks_by_id(parent_ids)
        return [
            c.model_copy(update={"parent_text": parents[c.hit.parent_id][0].text})
            if c.hit.parent_id in parents else c
            for c in candidates
        ]


def make_reranker(settings: Settings, store: VectorStore) -> Reranker | None:
    kind = settings.reranker_kind
    if kind == "cohere":
        assert settings.cohere_api_key is not None  # Settings refuses cohere without a key
        return CohereReranker(settings.cohere_api_key.get_secret_value(), model=settings.cohere_rerank_model,
                              base_url=settings.cohere_base_url, timeout_s=settings.rerank_timeout_s)
    if kind == "local":
        return LocalReranker(store)
    return None


def build_retriever(settings: Settings, store: VectorStore, embedder: Embedder, llm: LLM | None = None,
                    count_chunks: ChunkCounter | None = None) -> Retriever:
    """The Retriever the Settings describe (the one factory for strategies and reranker); with an
    LLM, the adaptive loop also asks it for query variants and a HyDE passage."""
    config = RetrievalConfig(
        strategies=settings.default_strategies, candidates=settings.retrieval_candidates, rrf_k=settings.rrf_k,
        weights=settings.fusion_weights, rerank=settings.reranker_kind != "none",
        rerank_top_n=settings.rerank_top_n, rerank_timeout_s=settings.rerank_timeout_s,
        adaptive=settings.adaptive_retrieval, min_confidence=settings.adaptive_min_confidence,
        max_iterations=settings.adaptive_max_iterations, time_budget_ms=settings.adaptive_time_budget_ms,
    )
    expander = LLMQueryExpander(llm) if llm is not None else None
    strategies = build_strategies(StrategyContext(store=store, settings=settings, count_chunks=count_chunks))
    return Retriever(store, embedder, strategies, make_reranker(settings, store), config, expander)
