"""Rerankers: a Protocol, Cohere Rerank (when a key is set), a local learned ranker, and none.

A reranker returns one score per candidate; the retriever sorts by it. Failures and timeouts
are the retriever's to handle: it keeps the fused order and records why.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from rag_service.domain import Candidate
from rag_service.errors import ConfigError, ProviderError


@runtime_checkable
class Reranker(Protocol):
    name: str
    # Whether ``rerank`` needs the query's embedding (the retriever computes it when no strategy did).
    needs_query_embedding: bool

    async def rerank(self, query: str, query_embedding: np.ndarray | None,
                     candidates: Sequence[Candidate]) -> list[float]:
        """One relevance score per candidate, in input order (higher is better)."""
        ...


class StoredSimilarities(Protocol):
    """The one thing the local reranker reads: stored chunks' cosine similarity to the query, by
    id (any VectorStore has it)."""

    async def similarities_by_id(
        self, chunk_ids: Sequence[uuid.UUID], embedding: Sequence[float]
    ) -> dict[uuid.UUID, float]: ...


class CohereReranker:
    """Cohere's rerank endpoint through the official ``cohere`` client (v2 API)."""

    name = "cohere"
    needs_query_embedding = False

    def __init__(self, api_key: str, *, model: str = "rerank-v3.5", base_url: str | None = None,
                 timeout_s: float = 5.0, max_tokens_per_doc: int = 512) -> None:
        import cohere

        if not api_key:
            raise ConfigError("the Cohere reranker needs RAGSVC_COHERE_API_KEY")
        self._model = model
        self._max_tokens = max_tokens_per_doc
        # Retries are the retriever's business (it has the time budget); the client makes one try.
        self._client = cohere.AsyncClientV2(api_key=api_key, base_url=base_url, timeout=timeout_s, max_retries=0)

    async def rerank(self, query: str, query_embedding: np.ndarray | None,
                     candidates: Sequence[Candidate]) -> list[float]:
        if not candidates:
            return []
        try:
            response = await self._client.rerank(
                model=self._model, query=query, documents=[c.hit.text for c in candidates],
                top_n=len(candidates), max_tokens_per_doc=self._max_tokens,
            )
        except Exception as exc:
            raise ProviderError(f"Cohere rerank failed: {type(exc).__name__}: {exc}", stage="reranker") from exc
        scores = [float("-inf")] * len(candidates)
        for result in response.results:
            if not 0 <= result.index < len(candidates):
                raise ProviderError(f"Cohere rerank returned index {result.index} for {len(candidates)} documents",
                                    stage="reranker")
            scores[result.index] = float(result.relevance_score)
        return scores


FEATURES = ("cosine_z", "bm25_z")


def _standardise(values: np.ndarray) -> np.ndarray:
    spread = values.std()
    return (values - values.mean()) / spread if spread > 0 else np.zeros_like(values)


def ranker_features(candidates: Sequence[Candidate], cosines: np.ndarray) -> np.ndarray:
    """Features of each candidate for the local ranker (rows follow ``candidates``, columns FEATURES).

    Both are z-scores within this query's candidates, which puts cosine similarity and BM25 on
    one scale (a convex combination of normalised scores; it beat RRF and rank features on
    SciFact's train split, see docs/benchmarks.md). ``cosines`` are exact query-chunk similarities
    for every candidate, so a chunk only the keyword list found still has its dense evidence; a
    chunk the keyword list missed gets the lowest BM25 score seen, a bound on its own."""
    n = len(candidates)
    features = np.zeros((n, len(FEATURES)), dtype=np.float64)
    if n == 0:
        return features
    keyword = [c.scores.get("keyword") for c in candidates]
    seen = [k for k in keyword if k is not None]
    floor = min(seen) if seen else 0.0
    features[:, 0] = _standardise(np.asarray(cosines, dtype=np.float64))
    features[:, 1] = _standardise(np.array([floor if k is None else k for k in keyword], dtype=np.float64))
    return features


@dataclass(frozen=True)
class LinearModel:
    """A standardised linear scorer (logistic regression weights) over named features: the local
    ranker's FEATURES, or the answerability model's."""

    features: tuple[str, ...]
    mean: np.ndarray
    scale: np.ndarray
    weights: np.ndarray
    bias: float
    trained_on: str
    threshold: float | None = None  # the operating point the training chose, for models that decide

    @classmethod
    def load(cls, path: Path | None = None, *, resource: str = "local_ranker.json",
             features: tuple[str, ...] = FEATURES) -> LinearModel:
        """Weights from ``path``, else from the package's ``resource``; they must be for ``features``."""
        if path is None:
            text = resources.files("rag_service.providers.data").joinpath(resource).read_text()
        else:
            text = path.read_text()
        data = json.loads(text)
        if tuple(data["features"]) != features:
            raise ConfigError(f"{path or resource} holds weights for features {data['features']}, "
                              f"this code makes {features}")
        return cls(tuple(data["features"]), np.array(data["mean"]), np.array(data["scale"]),
                   np.array(data["weights"]), float(data["bias"]), data.get("trained_on", ""),
                   data.get("threshold"))

    def score(self, features: np.ndarray) -> np.ndarray:
        return ((features - self.mean) / self.scale) @ self.weights + self.bias

    def probabilities(self, features: np.ndarray) -> np.ndarray:
        """The logistic of ``score``: for the models trained as logistic regressions."""
        return 1.0 / (1.0 + np.exp(-self.score(features)))

    def dump(self) -> dict[str, object]:
        return {"features": list(self.features), "mean": self.mean.tolist(), "scale": self.scale.tolist(),
                "weights": self.weights.tolist(), "bias": self.bias, "trained_on": self.trained_on,
                **({"threshold": self.threshold} if self.threshold is not None else {})}


class LocalReranker:
    """A learned linear ranker over retrieval scores, shipped as a few numbers in the package
    (trained by ``benchmarks/train_local_ranker.py`` on SciFact's train split only). It needs no
    model download: the one extra input is each candidate's cosine similarity to the query, computed
    by the store in one query."""

    name = "local"
    needs_query_embedding = True

    def __init__(self, store: StoredSimilarities, model: LinearModel | None = None) -> None:
        self._store = store
        self._model = model or LinearModel.load()

    async def rerank(self, query: str, query_embedding: np.ndarray | None,
                     candidates: Sequence[Candidate]) -> list[float]:
        if not candidates:
            return []
        if query_embedding is None:
            raise ProviderError("the local reranker needs the query embedding", stage="reranker")
        return self._model.score(ranker_features(candidates, await candidate_cosines(
            self._store, candidates, query_embedding))).tolist()


async def candidate_cosines(store: StoredSimilarities, candidates: Sequence[Candidate],
                            query_embedding: np.ndarray) -> np.ndarray:
    """Each candidate's cosine similarity to the query, in candidate order (0 for a chunk without
    an embedding): the local ranker's dense feature, for the ranker and its trainer alike."""
    stored = await store.similarities_by_id([c.hit.chunk_id for c in candidates], query_embedding)
    return np.array([stored.get(c.hit.chunk_id, 0.0) for c in candidates], dtype=np.float64)
