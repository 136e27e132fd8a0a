"""Rerankers: Cohere against a local fake of its API, the local ranker's features and model."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from rag_service.domain import Candidate, SearchHit
from rag_service.errors import ConfigError, ProviderError
from rag_service.providers.rerankers import (
    FEATURES,
    CohereReranker,
    LinearModel,
    LocalReranker,
    Reranker,
    ranker_features,
)
from tests.retrieval.fake_cohere import fake_cohere


def candidate(text: str, keyword: float | None = None) -> Candidate:
    hit = SearchHit(chunk_id=uuid.uuid4(), document_id=uuid.uuid4(), parent_id=None, ordinal=0, source_uri="t://",
                    title=None, text=text, start_char=0, end_char=len(text), score=0.0)
    scores = {"keyword": keyword} if keyword is not None else {}
    return Candidate(hit=hit, fused_score=0.1, ranks={"keyword": 1} if keyword is not None else {}, scores=scores)


async def test_cohere_reranker_speaks_the_v2_api() -> None:
    items = [candidate("bread and butter"), candidate("postgres connection pool"), candidate("pool party")]
    with fake_cohere() as server:
        reranker = CohereReranker("secret-key", base_url=server.url, model="rerank-v3.5")
        assert isinstance(reranker, Reranker)
        scores = await reranker.rerank("connection pool", None, items)
        request = server.requests[0]
    assert request["path"] == "/v2/rerank"
    assert request["auth"] == "Bearer secret-key"
    assert request["body"]["model"] == "rerank-v3.5"
    assert request["body"]["documents"] == [c.hit.text for c in items]
    assert scores == [0.0, 1.0, 0.5]


@pytest.mark.parametrize("mode", ["error", "bad-index"])
async def test_cohere_failures_raise_provider_errors(mode: str) -> None:
    with fake_cohere() as server:
        server.mode = mode
        reranker = CohereReranker("k", base_url=server.url)
        with pytest.raises(ProviderError, match="rerank"):
            await reranker.rerank("q", None, [candidate("a"), candidate("b")])


def test_cohere_needs_a_key() -> None:
    with pytest.raises(ConfigError, match="COHERE_API_KEY"):
        CohereReranker("")


def test_features_are_per_query_z_scores_with_a_floor_for_missing_bm25() -> None:
    items = [candidate("a", keyword=10.0), candidate("b", keyword=4.0), candidate("c")]
    features = ranker_features(items, np.array([0.2, 0.5, 0.8]))
    assert features.shape == (3, len(FEATURES))
    assert features[:, 0] == pytest.approx([-1.2247449, 0.0, 1.2247449])
    # The chunk no keyword list found gets the lowest BM25 seen (4.0), not zero.
    assert features[1, 1] == features[2, 1] < features[0, 1]
    assert np.allclose(features.mean(axis=0), 0.0)
    assert ranker_features([], np.array([])).shape == (0, len(FEATURES))
    same = ranker_features([candidate("a"), candidate("b")], np.array([0.3, 0.3]))
    assert np.all(same == 0.0)  # no spread, no signal, no division by zero


def test_shipped_model_loads_and_prefers_both_signals(tmp_path: Path) -> None:
    model = LinearModel.load()
    assert model.features == FEATURES
    assert "train" in model.trained_on
    assert all(w > 0 for w in model.weights), "more similar and higher BM25 must both score higher"
    data = model.dump()
    data["features"] = ["something", "else"]
    (tmp_path / "w.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="features"):
        LinearModel.load(tmp_path / "w.json")


class _Vectors:
    """A stand-in for the one store call the local reranker makes (the store itself is tested
    against PostgreSQL in tests/stores); here the arithmetic is under test."""

    def __init__(self, vectors: dict[uuid.UUID, np.ndarray]) -> None:
        self.vectors = vectors

    async def similarities_by_id(self, ids: Sequence[uuid.UUID], embedding: Sequence[float]) -> dict[uuid.UUID, float]:
        return {i: float(self.vectors[i] @ np.asarray(embedding)) for i in ids if i in self.vectors}


async def test_local_reranker_orders_by_the_model() -> None:
    items = [candidate("far", keyword=1.0), candidate("near", keyword=1.0), candidate("unknown")]
    query = np.array([1.0, 0.0], dtype=np.float32)
    store = _Vectors({items[0].hit.chunk_id: np.array([0.0, 1.0], dtype=np.float32),
                      items[1].hit.chunk_id: np.array([1.0, 0.0], dtype=np.float32)})
    model = LinearModel(FEATURES, np.zeros(2), np.ones(2), np.array([1.0, 0.5]), 0.0, "test")
    scores = await LocalReranker(store, model).rerank("q", query, items)
    assert scores[1] > scores[0]
    with pytest.raises(ProviderError, match="embedding"):
        await LocalReranker(store, model).rerank("q", None, items)
