"""The Retriever on a real PostgreSQL with the real local embedder: strategies, fusion, the
reranker fallbacks, the adaptive loop, parents, and access control through every path."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rag_service.config import load_settings
from rag_service.domain import ChunkRecord, DocumentRecord, RetrievalRequest, SearchFilter, SearchHit
from rag_service.errors import InvalidInputError
from rag_service.pipeline.retrieval.retriever import RetrievalConfig, Retriever, build_retriever
from rag_service.pipeline.retrieval.strategies import (
    PatternStrategy,
    RetrievalStrategy,
    StrategyContext,
    StrategyQuery,
    build_strategies,
)
from rag_service.providers.rerankers import CohereReranker, LocalReranker, candidate_cosines
from rag_service.stores.pgvector import PgVectorStore
from tests.retrieval.fake_cohere import fake_cohere
from tests.stores.contract import CORPUS, PRINCIPALS, visible

COLLECTION = "kb"
ALL_STRATEGIES = ("semantic", "keyword", "metadata", "pattern")


@pytest.fixture(scope="module")
def retriever(store: PgVectorStore, local_embedder, corpus) -> Retriever:
    return build_retriever(load_settings(reranker="local"), store, local_embedder)


def keys(result, corpus) -> list[str]:  # noqa: ANN001
    return [corpus[c.hit.document_id].key for c in result.candidates]


async def test_fused_results_keep_ranks_per_strategy(retriever: Retriever, corpus) -> None:
    result = await retriever.retrieve(RetrievalRequest(
        query="how long should I knead bread dough", filter=SearchFilter(collection=COLLECTION), top_k=3,
        adaptive=False))
    top = result.candidates[0]
    assert corpus[top.hit.document_id].key == "bread"
    assert {"semantic", "keyword"} <= top.ranks.keys()
    assert top.scores["semantic"] > 0.3 and top.scores["keyword"] > 0
    assert result.rerank is not None and result.rerank.applied and result.rerank.reranker == "local"
    assert top.rerank_score is not None
    [first] = result.iterations
    assert first.action == "search" and {r.strategy for r in first.strategies} == set(ALL_STRATEGIES)
    metadata = next(r for r in first.strategies if r.strategy == "metadata")
    assert metadata.hits == 0 and "no structured constraint" in metadata.detail["skipped"]


async def test_pattern_strategy_finds_identifiers(retriever: Retriever, corpus) -> None:
    result = await retriever.retrieve(RetrievalRequest(
        query="error E-4012", filter=SearchFilter(collection=COLLECTION, principals=("legal-team",)),
        strategies=("pattern",), rerank=False, adaptive=False))
    assert set(keys(result, corpus)) == {"pg", "merger"}
    assert all("E-4012" in c.hit.text for c in result.candidates)
    report = result.iterations[0].strategies[0]
    assert report.detail["patterns"] == ["E-4012"]


async def test_pattern_strategy_leaves_out_a_pattern_found_in_too_many_chunks(store: PgVectorStore, local_embedder,
                                                                               corpus) -> None:
    """E-4012 is in two chunks the legal team may read, max_connections in one: with a bound of one
    match, the first is left to keyword search and said so, the second still found."""
    def retriever_bounded_at(max_matches: int) -> Retriever:
        strategies = {"pattern": PatternStrategy(store, max_matches=max_matches)}
        return Retriever(store, local_embedder, strategies, None, RetrievalConfig(strategies=("pattern",)))

    request = RetrievalRequest(query="E-4012 max_connections", adaptive=False,
                               filter=SearchFilter(collection=COLLECTION, principals=("legal-team",)))
    result = await retriever_bounded_at(1).retrieve(request)
    assert keys(result, corpus) == ["pg"]
    report = result.iterations[0].strategies[0]
    assert report.detail["patterns"] == ["E-4012", "max_connections"] and report.detail["too_common"] == ["E-4012"]
    assert report.error is None
    result = await retriever_bounded_at(2).retrieve(request)
    assert set(keys(result, corpus)) == {"pg", "merger"}
    assert "too_common" not in result.iterations[0].strategies[0].detail


async def test_metadata_strategy_uses_structured_constraints(retriever: Retriever, corpus) -> None:
    result = await retriever.retrieve(RetrievalRequest(
        query="anything", filter=SearchFilter(collection=COLLECTION, tags_any=("recipes", "database")),
        strategies=("metadata",), rerank=False, adaptive=False))
    assert keys(result, corpus)[:2] == ["pg", "pg"]  # newest first: pg (2024) before bread (2021)
    assert set(keys(result, corpus)) == {"pg", "bread"}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(principals=st.sets(st.sampled_from(PRINCIPALS)),
       strategies=st.sampled_from([(s,) for s in ALL_STRATEGIES] + [ALL_STRATEGIES]),
       rerank=st.booleans(), adaptive=st.booleans())
async def test_restricted_chunks_never_reach_a_caller_without_the_principal(
        retriever: Retriever, corpus, principals, strategies, rerank, adaptive) -> None:
    # The query aims at the restricted documents in every strategy's terms: meaning, words,
    # an identifier they hold, and a tag filter that the adaptive loop may relax.
    flt = SearchFilter(collection=COLLECTION, principals=tuple(sorted(principals)),
                       tags_any=("deals", "compensation", "database"))
    result = await retriever.retrieve(RetrievalRequest(
        query="Confidential Project Falcon salary bands error E-4012", filter=flt, top_k=50,
        strategies=strategies, rerank=rerank, adaptive=adaptive))
    allowed = {k for k in (d.key for d in CORPUS) if visible(next(d for d in CORPUS if d.key == k), principals)}
    found = set(keys(result, corpus))
    assert found <= allowed, f"{strategies} leaked {found - allowed} to {principals}"
    if strategies == ("metadata",) or strategies == ALL_STRATEGIES:
        # Not vacuous: what the caller may see under the filter is found.
        expected = {d.key for d in CORPUS if d.collection == COLLECTION and visible(d, principals)
                    and {"deals", "compensation", "database"} & set(d.tags)}
        assert expected <= found


async def test_restricted_document_is_found_with_the_principal(retriever: Retriever, corpus) -> None:
    query = "Project Falcon acquisition"
    without = await retriever.retrieve(RetrievalRequest(query=query, filter=SearchFilter(collection=COLLECTION)))
    with_principal = await retriever.retrieve(RetrievalRequest(
        query=query, filter=SearchFilter(collection=COLLECTION, principals=("legal-team",))))
    assert "merger" not in keys(without, corpus)
    assert keys(with_principal, corpus)[0] == "merger"


def strategies_for(store: PgVectorStore) -> dict[str, RetrievalStrategy]:
    return build_strategies(StrategyContext(store, load_settings()))


class FailingEmbedder:
    name, dimension = "broken", 384

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        raise RuntimeError("model server down")

    async def warm_up(self) -> None:
        return None

    async def close(self) -> None:
        return None


async def test_semantic_failure_falls_back_to_keyword(store: PgVectorStore, corpus) -> None:
    settings_ = load_settings(reranker="none")
    retriever = Retriever(store, FailingEmbedder(), build_strategies(StrategyContext(store, settings_)), None,
                          RetrievalConfig(adaptive=False))
    result = await retriever.retrieve(RetrievalRequest(
        query="bread flour yeast", filter=SearchFilter(collection=COLLECTION), strategies=("semantic",)))
    assert keys(result, corpus)[0] == "bread"
    reports = result.iterations[0].strategies
    assert reports[0].strategy == "semantic" and "model server down" in reports[0].error
    assert reports[1].strategy == "keyword" and reports[1].detail["fallback_for"] == "semantic"
    assert result.candidates[0].ranks == {"keyword": 1}


async def test_strategies_without_embeddings_do_not_wait_for_the_embedder(
        store: PgVectorStore, local_embedder, corpus) -> None:  # noqa: ANN001
    events: list[str] = []

    class SlowEmbedder:  # the real model behind a network-like delay
        name, dimension = local_embedder.name, local_embedder.dimension

        async def embed(self, texts: Sequence[str]) -> np.ndarray:
            await asyncio.sleep(0.3)
            vectors = await local_embedder.embed(texts)
            events.append("embedded")
            return vectors

    class Recorded:
        def __init__(self, inner: RetrievalStrategy) -> None:
            self.inner, self.name, self.needs_embedding = inner, inner.name, inner.needs_embedding

        async def search(self, query: StrategyQuery) -> list[SearchHit]:
            events.append(f"{self.name} started")
            return await self.inner.search(query)

    strategies = {name: Recorded(s) for name, s in strategies_for(store).items()}
    retriever = Retriever(store, SlowEmbedder(), strategies, None, RetrievalConfig(adaptive=False))  # type: ignore[arg-type]
    result = await retriever.retrieve(RetrievalRequest(
        query="how long should I knead bread dough", filter=SearchFilter(collection=COLLECTION),
        strategies=("semantic", "keyword")))
    assert events.index("keyword started") < events.index("embedded") < events.index("semantic started")
    assert keys(result, corpus)[0] == "bread" and {"semantic", "keyword"} <= result.candidates[0].ranks.keys()


@pytest.mark.parametrize("mode, error", [("error", "Cohere rerank failed"), ("slow", "timed out")])
async def test_reranker_failure_keeps_the_fused_order(store, local_embedder, corpus, mode, error) -> None:
    settings_ = load_settings(reranker="none")
    with fake_cohere() as server:
        server.mode, server.delay_s = mode, 2.0
        reranker = CohereReranker("k", base_url=server.url, timeout_s=5)
        retriever = Retriever(store, local_embedder, build_strategies(StrategyContext(store, settings_)), reranker,
                              RetrievalConfig(adaptive=False, rerank_timeout_s=0.5))
        request = RetrievalRequest(query="PostgreSQL settings", filter=SearchFilter(collection=COLLECTION))
        result = await retriever.retrieve(request)
        unranked = await retriever.retrieve(request.model_copy(update={"rerank": False}))
    assert result.rerank is not None and not result.rerank.applied
    assert error in result.rerank.error
    assert [c.hit.chunk_id for c in result.candidates] == [c.hit.chunk_id for c in unranked.candidates]
    assert all(c.rerank_score is None for c in result.candidates)


async def test_cohere_reorders_when_it_answers(store, local_embedder, corpus) -> None:
    with fake_cohere() as server:
        retriever = Retriever(store, local_embedder, strategies_for(store),
                              CohereReranker("k", base_url=server.url), RetrievalConfig(adaptive=False))
        result = await retriever.retrieve(RetrievalRequest(
            query="standby promoted primary fails", filter=SearchFilter(collection="other")))
    assert result.rerank.applied and result.candidates[0].hit.text.startswith("A standby can be promoted")
    scores = [c.rerank_score for c in result.candidates]
    assert scores == sorted(scores, reverse=True)


async def test_adaptive_loop_acts_when_confidence_is_low(store, local_embedder, corpus) -> None:
    retriever = Retriever(store, local_embedder, strategies_for(store), None,
                          RetrievalConfig(min_confidence=0.99, max_iterations=5, time_budget_ms=10_000))
    flt = SearchFilter(collection=COLLECTION, lob="food")
    result = await retriever.retrieve(RetrievalRequest(
        query="What limits PostgreSQL connections? And how do I knead dough?", filter=flt, top_k=5))
    actions = [i.action for i in result.iterations]
    assert actions == ["search", "relax_filters", "decompose", "rewrite", "widen"]
    relax = result.iterations[1]
    assert relax.filter_relaxed and relax.results > result.iterations[0].results
    decompose = result.iterations[2]
    assert decompose.queries == ["What limits PostgreSQL connections", "how do I knead dough"]
    assert result.iterations[4].top_k == 2 * result.iterations[3].top_k
    assert all(0 <= i.confidence <= 1 and i.strategies for i in result.iterations)
    # Relaxing the LOB filter found the PostgreSQL document the question also asks about.
    assert {"pg", "bread"} <= {corpus[c.hit.document_id].key for c in result.candidates}


async def test_adaptive_loop_respects_its_time_budget(store, local_embedder, corpus) -> None:
    retriever = Retriever(store, local_embedder, strategies_for(store), None,
                          RetrievalConfig(min_confidence=1.0, max_iterations=10, time_budget_ms=1))
    result = await retriever.retrieve(RetrievalRequest(query="bread", filter=SearchFilter(collection=COLLECTION)))
    assert len(result.iterations) == 1  # the first pass used the whole 1 ms budget
    assert result.candidates  # the first pass always runs


async def test_confident_results_stop_the_loop(retriever: Retriever, corpus) -> None:
    result = await retriever.retrieve(RetrievalRequest(
        query="Baking bread requires flour, water, yeast and salt", filter=SearchFilter(collection=COLLECTION)))
    assert result.confidence >= retriever.config.min_confidence
    assert len(result.iterations) == 1


async def test_parents_expand_for_context(store: PgVectorStore, local_embedder) -> None:
    doc_id = await store.upsert_document(DocumentRecord(collection="tree", source_uri="t://tree", content_hash="t"))
    parent_text = "Section on otters. Sea otters hold hands while sleeping. They use rocks as tools."
    parent = ChunkRecord(document_id=doc_id, ordinal=0, text=parent_text, start_char=0, end_char=len(parent_text),
                         token_count=15, content_hash="p")
    child_text = "Sea otters hold hands while sleeping."
    child = ChunkRecord(document_id=doc_id, parent_id=parent.id, ordinal=1, text=child_text, start_char=19,
                        end_char=56, token_count=6, content_hash="c",
                        embedding=(await local_embedder.embed([child_text]))[0].tolist())
    await store.upsert_chunks([parent, child])
    retriever = Retriever(store, local_embedder, strategies_for(store), None, RetrievalConfig())
    result = await retriever.retrieve(RetrievalRequest(query="otters sleeping", filter=SearchFilter(collection="tree"),
                                                       expand_parents=True))
    assert [c.hit.chunk_id for c in result.candidates] == [child.id]
    assert result.candidates[0].parent_text == parent_text


async def test_strategies_run_concurrently(store: PgVectorStore, local_embedder, corpus) -> None:
    class Slow:
        def __init__(self, name: str) -> None:
            self.name, self.needs_embedding = name, False

        async def search(self, query):  # noqa: ANN001, ANN201
            await asyncio.sleep(0.3)
            return []

    strategies = {n: Slow(n) for n in ("a", "b", "c")}
    retriever = Retriever(store, local_embedder, strategies, None, RetrievalConfig(strategies=("a", "b", "c"),
                                                                                    adaptive=False))
    result = await retriever.retrieve(RetrievalRequest(query="x", filter=SearchFilter()))
    assert result.elapsed_ms < 600, "three 300 ms strategies must overlap"


async def test_bad_requests_are_refused(retriever: Retriever) -> None:
    with pytest.raises(ValueError, match="must contain some text"):
        RetrievalRequest(query="   ")
    with pytest.raises(ValueError):
        RetrievalRequest(query="x", top_k=0)
    retriever_without_pattern = Retriever(retriever._store, retriever._embedder, {}, None,
                                          RetrievalConfig(strategies=()))
    with pytest.raises(InvalidInputError, match="unknown strategies"):
        await retriever_without_pattern.retrieve(RetrievalRequest(query="x", strategies=("pattern",)))


async def test_local_reranker_reads_exact_cosines_from_the_store(store: PgVectorStore, local_embedder, corpus) -> None:
    retriever = Retriever(store, local_embedder, strategies_for(store), LocalReranker(store),
                          RetrievalConfig(adaptive=False))
    query = "standby promoted when primary fails"
    fused, _, _, embedding = await retriever.fused_candidates(RetrievalRequest(
        query=query, filter=SearchFilter(collection="other")))
    cosines = await candidate_cosines(store, fused, embedding)
    expected = (await local_embedder.embed([query]))[0]
    assert np.allclose(embedding, expected, atol=1e-6)
    semantic = [(i, c.scores["semantic"]) for i, c in enumerate(fused) if "semantic" in c.scores]
    assert semantic
    for i, cosine in semantic:
        assert cosines[i] == cosine  # the same expression as the semantic search's score
    assert all(-1 <= c <= 1 for c in cosines)


async def test_the_local_reranker_runs_on_a_keyword_only_search(store: PgVectorStore, local_embedder, corpus) -> None:
    """No semantic strategy ran, so no query embedding came out of retrieval: the retriever embeds
    the query for the reranker instead of letting it fail into the fused order."""
    retriever = Retriever(store, local_embedder, strategies_for(store), LocalReranker(store),
                          RetrievalConfig(adaptive=False))
    request = RetrievalRequest(query="standby promoted when primary fails", strategies=("keyword",),
                               filter=SearchFilter(collection="other"))
    result = await retriever.retrieve(request)
    assert result.candidates and result.rerank is not None
    assert result.rerank.applied and result.rerank.error is None
    assert all(c.rerank_score is not None for c in result.candidates)


async def test_a_failing_pattern_degrades_instead_of_failing_the_search(store: PgVectorStore, database,
                                                                      local_embedder, corpus) -> None:
    class TimingOut(PgVectorStore):
        """The store's answer to a pattern that ran past the timeout, for one strategy."""

        async def pattern_search(self, *args: object, **kwargs: object) -> list[SearchHit]:
            raise InvalidInputError("pattern took longer than 2000 ms")

    strategies = strategies_for(store)
    strategies["pattern"] = PatternStrategy(TimingOut(database))
    retriever = Retriever(store, local_embedder, strategies, None, RetrievalConfig(adaptive=False))
    result = await retriever.retrieve(RetrievalRequest(query='bread "knead the dough"',
                                                       filter=SearchFilter(collection=COLLECTION)))
    assert keys(result, corpus)[0] == "bread"
    pattern = next(r for r in result.iterations[0].strategies if r.strategy == "pattern")
    assert "took longer" in pattern.error


class KeywordWithoutKeys:
    """The keyword strategy without ``query_keys``: every query is searched."""

    name, needs_embedding = "keyword", False

    def __init__(self, inner: RetrievalStrategy) -> None:
        self._inner = inner

    async def search(self, query: StrategyQuery) -> list[SearchHit]:
        return await self._inner.search(query)


async def test_a_rewrite_with_the_same_terms_reuses_the_keyword_results(store, local_embedder, corpus) -> None:
    """"What limits PostgreSQL connections?" and its rule-based rewrite "limits PostgreSQL
    connections" have the same BM25 terms ("what" is a stopword): the rewrite pass reuses the
    question's keyword list, and the results are what searching again would have given."""
    config = RetrievalConfig(min_confidence=1.0, max_iterations=2, time_budget_ms=20_000)
    request = RetrievalRequest(query="What limits PostgreSQL connections?", filter=SearchFilter(collection=COLLECTION))
    strategies = strategies_for(store)
    reusing = await Retriever(store, local_embedder, strategies, None, config).retrieve(request)
    searching = await Retriever(store, local_embedder, {**strategies, "keyword": KeywordWithoutKeys(
        strategies["keyword"])}, None, config).retrieve(request)

    rewrite = reusing.iterations[1]
    assert rewrite.action == "rewrite" and "limits PostgreSQL connections" in rewrite.queries
    keyword = next(r for r in rewrite.strategies
                   if r.strategy == "keyword" and r.query == "limits PostgreSQL connections")
    assert keyword.detail == {"same_results_as": "What limits PostgreSQL connections?"} and keyword.hits > 0
    again = next(r for r in searching.iterations[1].strategies
                 if r.strategy == "keyword" and r.query == "limits PostgreSQL connections")
    assert "same_results_as" not in again.detail and again.hits == keyword.hits
    assert [(c.hit.chunk_id, c.fused_score) for c in reusing.candidates] == \
        [(c.hit.chunk_id, c.fused_score) for c in searching.candidates]


async def test_a_rewrite_that_only_splits_hyphens_reuses_the_keyword_results(store, local_embedder, corpus) -> None:
    """"dough-kneading yeast-rise" has one rule-based rewrite, its hyphens split. PostgreSQL
    already reads a hyphenated word's parts, so the rewrite reuses the question's keyword list
    (while the semantic leg, whose input did change, searches it)."""
    config = RetrievalConfig(min_confidence=1.0, max_iterations=2, time_budget_ms=20_000)
    question = "dough-kneading yeast-rise"
    result = await Retriever(store, local_embedder, strategies_for(store), None, config).retrieve(
        RetrievalRequest(query=question, filter=SearchFilter(collection=COLLECTION)))
    assert result.iterations[0].confidence < 1.0
    rewrite = result.iterations[1]
    assert rewrite.action == "rewrite" and rewrite.queries == ["dough kneading yeast rise"]
    reports = {r.strategy: r for r in rewrite.strategies}
    assert reports["keyword"].detail == {"same_results_as": question} and reports["keyword"].hits > 0
    assert "same_results_as" not in reports["semantic"].detail and reports["semantic"].elapsed_ms > 0
