"""The local scorer (local-v1): all seven metrics without an LLM, from the text evidence alone
(plus the embedder's question-answer cosine when the caller supplies it)."""

from __future__ import annotations

from collections.abc import Mapping

from rag_service.domain import Evaluation, MetricScore
from rag_service.scoring import (
    consistency,
    correctness,
    coverage,
    faithfulness,
    freshness,
    relevance,
    traceability,
)
from rag_service.scoring.evidence import ScoringInput

DEFAULT_WEIGHTS: Mapping[str, float] = {"faithfulness": 0.25, "relevance": 0.20, "correctness": 0.20,
                                        "coverage": 0.15, "consistency": 0.10, "freshness": 0.05,
                                        "traceability": 0.05}


def score_metrics(inp: ScoringInput, half_life_days: float = freshness.DEFAULT_HALF_LIFE_DAYS) -> list[MetricScore]:
    return [faithfulness.score(inp), relevance.score(inp), correctness.score(inp), coverage.score(inp),
            consistency.score(inp), freshness.score(inp, half_life_days), traceability.score(inp)]


def evaluate(inp: ScoringInput, weights: Mapping[str, float] = DEFAULT_WEIGHTS,
             half_life_days: float = freshness.DEFAULT_HALF_LIFE_DAYS) -> Evaluation:
    return Evaluation.from_scores(score_metrics(inp, half_life_days), weights)
