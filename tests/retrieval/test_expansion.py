"""LLM query variants and HyDE against a local OpenAI-compatible server, alone and in the loop."""

from __future__ import annotations

import json

import pytest

from rag_service.config import load_settings
from rag_service.domain import RetrievalRequest, SearchFilter
from rag_service.errors import ProviderError
from rag_service.pipeline.retrieval.expansion import LLMQueryExpander
from rag_service.pipeline.retrieval.retriever import RetrievalConfig, Retriever
from rag_service.pipeline.retrieval.strategies import StrategyContext, build_strategies
from rag_service.providers.llm import make_llm
from rag_service.stores.pgvector import PgVectorStore
from tests.fake_openai import Reply, fake_openai


def llm_for(url: str):  # noqa: ANN201
    return make_llm(load_settings(llm_base_url=url, llm_api_key="k", llm_model_simple="small-model"))


async def test_variants_parse_dedupe_and_cap() -> None:
    with fake_openai() as server:
        server.queue(json.dumps({"queries": ["pool exhausted", "Pool Exhausted", "max_connections", "", 7, "a", "b"]}))
        variants = await LLMQueryExpander(llm_for(server.url)).variants("connection pool error")
        request = server.requests[0]
    assert variants == ["pool exhausted", "max_connections", "a"]
    assert request["path"] == "/v1/chat/completions"
    assert request["body"]["model"] == "small-model"
    assert request["body"]["response_format"] == {"type": "json_object"}


@pytest.mark.parametrize("reply", ["not json", '{"other": 1}', '{"queries": "one"}'])
async def test_malformed_variants_are_provider_errors(reply: str) -> None:
    with fake_openai() as server:
        server.queue(reply)
        with pytest.raises(ProviderError, match="query variants"):
            await LLMQueryExpander(llm_for(server.url)).variants("q")


async def test_hyde_returns_the_passage() -> None:
    with fake_openai() as server:
        server.queue("  Bread dough is kneaded for about ten minutes.  ")
        passage = await LLMQueryExpander(llm_for(server.url)).hypothetical_document("how long to knead")
    assert passage == "Bread dough is kneaded for about ten minutes."


async def test_loop_uses_llm_variants_and_hyde(store: PgVectorStore, local_embedder, corpus) -> None:
    with fake_openai() as server:
        server.queue(json.dumps({"queries": ["dough kneading time"]}),
                     "Knead the dough for ten minutes and let it rise.")
        retriever = Retriever(store, local_embedder, build_strategies(StrategyContext(store, load_settings())), None,
                              RetrievalConfig(min_confidence=1.0, max_iterations=4, time_budget_ms=20_000),
                              LLMQueryExpander(llm_for(server.url)))
        result = await retriever.retrieve(RetrievalRequest(query="How long should one work bread?",
                                                           filter=SearchFilter(collection="kb")))
    actions = [i.action for i in result.iterations]
    assert actions == ["search", "rewrite", "hyde", "widen"]
    assert "dough kneading time" in result.iterations[1].queries
    hyde = result.iterations[2]
    assert hyde.queries == ["Knead the dough for ten minutes and let it rise."]
    assert [r.strategy for r in hyde.strategies] == ["semantic"]
    assert result.candidates[0].hit.source_uri == "test://bread"


async def test_llm_failure_is_recorded_and_the_loop_goes_on(store: PgVectorStore, local_embedder,
                                                            corpus) -> None:
    with fake_openai() as server:
        server.default = Reply(status=500)
        retriever = Retriever(store, local_embedder, build_strategies(StrategyContext(store, load_settings())), None,
                              RetrievalConfig(min_confidence=1.0, max_iterations=4, time_budget_ms=20_000),
                              LLMQueryExpander(llm_for(server.url)))
        result = await retriever.retrieve(RetrievalRequest(query="What is the bread recipe?",
                                                           filter=SearchFilter(collection="kb")))
    rewrite, hyde = result.iterations[1], result.iterations[2]
    assert "LLM variants failed" in rewrite.thought and rewrite.queries == ["bread recipe"]
    assert hyde.action == "hyde" and "failed" in hyde.thought
    assert result.iterations[3].action == "widen"
    assert result.candidates
