"""POST /v1/search over HTTP, and `ragsvc search`, on documents ingested through the API."""

from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from rag_service.api import create_app
from rag_service.cli import app as cli
from rag_service.config import get_settings, load_settings
from rag_service.domain import SearchHit
from rag_service.errors import ConfigError
from rag_service.pipeline.retrieval.strategies import (
    KeywordStrategy,
    StrategyQuery,
    register_strategy,
    unregister_strategy,
)
from rag_service.stores.base import VectorStore

DOCS = [
    {"source_uri": "pool.md", "title": "Connection pool",
     "text": "# Pool\n\nError E-4012 means the connection pool is exhausted. Raise max_connections.",
     "tags": ["db"]},
    {"source_uri": "bread.md", "title": "Bread", "text": "Knead the dough for ten minutes, then let it rise.",
     "tags": ["food"]},
    {"source_uri": "falcon.md", "title": "Falcon", "text": "Project Falcon will acquire a competitor next quarter.",
     "acl": ["legal-team"]},
]


@pytest.fixture(scope="module")
def client(migrated_url: str):
    settings = load_settings(database_url=migrated_url, serve_worker="on", worker_heartbeat_s=1)
    with TestClient(create_app(settings)) as test_client:
        # One request per document: a request's documents share tags and ACL.
        urls = []
        for doc in DOCS:
            response = test_client.post("/v1/documents", json={**doc, "collection": "s"})
            assert response.status_code == 202, response.text
            urls.append(response.json()["status_url"])
        deadline = time.monotonic() + 120
        for url in urls:
            while (job := test_client.get(url).json())["status"] not in ("succeeded", "failed"):
                assert time.monotonic() < deadline, job
                time.sleep(0.2)
            assert job["status"] == "succeeded", job
        yield test_client


def test_search_returns_ranked_chunks_with_their_provenance(client: TestClient) -> None:
    response = client.post("/v1/search", json={"query": "what does error E-4012 mean", "collection": "s"})
    assert response.status_code == 200, response.text
    body = response.json()
    first = body["results"][0]
    assert first["source_uri"] == "pool.md" and first["title"] == "Connection pool"
    assert first["rank"] == 1 and "E-4012" in first["text"]
    assert {"semantic", "keyword", "pattern"} <= first["ranks"].keys()
    assert first["end_char"] > first["start_char"] >= 0
    assert first["score"] == first["rerank_score"]  # the local reranker ordered them
    assert body["rerank"]["applied"] and body["iterations"][0]["action"] == "search"
    assert 0 <= body["confidence"] <= 1


def test_strategies_filters_and_top_k(client: TestClient) -> None:
    body = client.post("/v1/search", json={
        "query": "minutes", "collection": "s", "strategies": ["keyword"], "top_k": 1,
        "filters": {"tags_any": ["food"]}, "rerank": False, "adaptive": False}).json()
    assert [r["source_uri"] for r in body["results"]] == ["bread.md"]
    assert body["results"][0]["ranks"] == {"keyword": 1}
    assert body["rerank"] is None


def test_acl_is_applied_to_the_callers_principals(client: TestClient) -> None:
    query = {"query": "Project Falcon acquisition", "collection": "s"}
    anonymous = client.post("/v1/search", json=query).json()
    legal = client.post("/v1/search", json={**query, "principals": ["legal-team"]}).json()
    assert "falcon.md" not in {r["source_uri"] for r in anonymous["results"]}
    assert legal["results"][0]["source_uri"] == "falcon.md"


@pytest.mark.parametrize("body, field", [
    ({"query": ""}, "query"),
    ({"query": "x", "top_k": 0}, "top_k"),
    ({"query": "x", "top_k": 101}, "top_k"),
    ({"query": "x", "strategies": ["telepathy"]}, "strategies"),
    ({"query": "x", "strategies": []}, "strategies"),
    ({"query": "x", "acl_bypass": True}, "acl_bypass"),
    ({"query": "x", "filters": {"metadata_range": {"year": {}}}}, "filters"),
    ({"query": "x", "filters": {"principals": ["admin"]}}, "filters"),
    ({"query": "x", "collection": "bad name!"}, "collection"),
])
def test_bad_requests_say_which_field(client: TestClient, body: dict, field: str) -> None:
    response = client.post("/v1/search", json={"collection": "s", **body})
    assert response.status_code == 422, response.text
    problem = response.json()
    assert any(field in e["field"] for e in problem["detail"]), problem


def test_blank_query_and_bad_principals_are_422(client: TestClient) -> None:
    assert client.post("/v1/search", json={"query": "   ", "collection": "s"}).status_code == 422
    response = client.post("/v1/search", json={"query": "x", "collection": "s", "principals": ["*"]})
    assert response.status_code == 422 and "principals" in response.json()["detail"]


def test_unknown_collection_is_404(client: TestClient) -> None:
    response = client.post("/v1/search", json={"query": "x", "collection": "nope"})
    assert response.status_code == 404
    assert "nope" in response.json()["detail"]


def test_openapi_documents_the_search_contract(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    operation = spec["paths"]["/v1/search"]["post"]
    assert operation["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("SearchRequest")
    assert {"200", "404", "422"} <= operation["responses"].keys()
    request = spec["components"]["schemas"]["SearchRequest"]["properties"]
    assert "acl_bypass" not in request and "principals" in request


def test_cli_search_prints_json_and_a_table(client: TestClient, migrated_url: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSVC_DATABASE_URL", migrated_url)
    get_settings.cache_clear()
    runner = CliRunner()
    result = runner.invoke(cli, ["search", "connection pool exhausted", "-c", "s", "-k", "2", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["results"][0]["source_uri"] == "pool.md" and len(payload["results"]) <= 2
    table = runner.invoke(cli, ["search", "knead dough", "-c", "s", "--strategy", "keyword", "--no-rerank"])
    assert table.exit_code == 0 and "bread.md" in table.stdout
    missing = runner.invoke(cli, ["search", "x", "-c", "nope"])
    assert missing.exit_code != 0 and "does not exist" in missing.output
    bad = runner.invoke(cli, ["search", "x", "--strategy", "telepathy"])
    assert bad.exit_code != 0 and "strategies" in bad.output
    get_settings.cache_clear()


class BreadOnly:
    """A strategy registered by a test: BM25 for "dough", whatever the query."""

    name = "bread_only"
    needs_embedding = False

    def __init__(self, store: VectorStore) -> None:
        self._keyword = KeywordStrategy(store)

    async def search(self, query: StrategyQuery) -> list[SearchHit]:
        return await self._keyword.search(StrategyQuery(text="dough", filter=query.filter, top_k=query.top_k))


def test_a_registered_strategy_can_be_requested_through_the_api(client: TestClient, migrated_url: str) -> None:
    body = {"query": "connection pool", "collection": "s", "strategies": ["bread_only"], "rerank": False}
    refused = client.post("/v1/search", json=body)
    assert refused.status_code == 422 and "unknown strategy 'bread_only'" in refused.text
    register_strategy("bread_only", lambda c: BreadOnly(c.store), "BM25 for dough")
    try:
        settings = load_settings(database_url=migrated_url, serve_worker="off",
                                 retrieval_strategies="semantic,bread_only")
        assert settings.default_strategies == ("semantic", "bread_only")
        with TestClient(create_app(settings)) as second:
            response = second.post("/v1/search", json=body)
            assert response.status_code == 200, response.text
            results = response.json()["results"]
            assert [r["source_uri"] for r in results] == ["bread.md"] and results[0]["ranks"] == {"bread_only": 1}
            schema = second.get("/openapi.json").json()["components"]["schemas"]["SearchRequest"]
            assert "bread_only" in schema["properties"]["strategies"]["anyOf"][0]["items"]["enum"]
    finally:
        unregister_strategy("bread_only")
    with pytest.raises(ConfigError, match="unknown strategy 'bread_only'"):
        load_settings(retrieval_strategies="bread_only")
