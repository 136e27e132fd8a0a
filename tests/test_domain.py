"""The shared types: evaluation scores and the strategy-name registry."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rag_service.domain import METRICS, Evaluation, MetricScore, RouteSpec, SearchRequest
from rag_service.domain.strategies import add_strategy_name, remove_strategy_name, strategy_names


def score(metric: str, value: float | None) -> MetricScore:
    return MetricScore(metric=metric, value=value, reason="because", scorer="local-v1")


def test_the_overall_score_weights_only_the_judged_metrics() -> None:
    assert len(METRICS) == 7
    scores = [score("faithfulness", 1.0), score("relevance", 0.5), score("freshness", None)]
    evaluation = Evaluation.from_scores(scores, {"faithfulness": 3, "relevance": 1, "freshness": 10})
    assert evaluation.overall == pytest.approx((3 * 1.0 + 1 * 0.5) / 4)
    assert evaluation.get("freshness").value is None and evaluation.get("coverage") is None
    assert Evaluation.from_scores([score("freshness", None)], {"freshness": 1}).overall is None
    with pytest.raises(ValidationError, match="scored once"):
        Evaluation(scores=(score("relevance", 1.0), score("relevance", 0.0)), overall=0.5)
    with pytest.raises(ValidationError):
        score("relevance", 1.5)
    with pytest.raises(ValueError, match=">= 0"):
        Evaluation.from_scores(scores, {"faithfulness": -1})


def test_the_overall_score_survives_tiny_weights() -> None:
    """Found by the design property test: a subnormal weight on the only judged metric made
    value x weight underflow to 0, so a 0.5 came out as an overall 0.0."""
    tiny = 5e-324
    assert Evaluation.from_scores([score("relevance", 0.5)], {"relevance": tiny}).overall == 0.5
    both = [score("relevance", 0.25), score("coverage", 0.75)]
    assert Evaluation.from_scores(both, {"relevance": tiny, "coverage": tiny}).overall == 0.5


def test_strategy_names_come_from_one_registry() -> None:
    assert strategy_names()[:4] == ("semantic", "keyword", "metadata", "pattern")
    with pytest.raises(ValidationError, match="unknown strategy 'graph'"):
        SearchRequest(query="q", strategies=["graph"])
    with pytest.raises(ValidationError, match="unknown strategy 'graph'"):
        RouteSpec(strategies=["graph"])
    add_strategy_name("graph")
    try:
        assert SearchRequest(query="q", strategies=["graph"]).strategies == ["graph"]
        assert RouteSpec(strategies=["graph", "keyword"]).strategies == ["graph", "keyword"]
    finally:
        remove_strategy_name("graph")
    with pytest.raises(ValueError, match="built-in"):
        remove_strategy_name("semantic")
    with pytest.raises(ValueError, match="lowercase"):
        add_strategy_name("Bad Name")
