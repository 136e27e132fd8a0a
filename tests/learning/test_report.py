"""An experiment's report from observations (pure): per-variant statistics, cost, the decision."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import numpy as np

from rag_service.db.repos.experiments import Observation
from rag_service.domain.prompts import Experiment
from rag_service.learning.report import Prices, answer_cost, report

EXPERIMENT = Experiment(id=uuid.uuid4(), name="answer_cot", control_label="production", candidate_label="candidate",
                        control_version=1, candidate_version=2, share=0.5, alpha=0.05, tau=0.05, status="running",
                        stop_reason=None, started_by="admin", note=None, created_at=datetime.now(UTC), ended_at=None)


def _observations(n: int, means: dict[str, float], tokens: dict[str, dict[str, int]], seed: int = 0
                  ) -> list[Observation]:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        variant = ("control", "candidate")[i % 2]
        overall = float(np.clip(rng.normal(means[variant], 0.1), 0, 1))
        rows.append(Observation(variant=variant, unit=f"query:{i}", overall=overall, answered=True, queued=False,
                                decision=None, latency_ms=100.0 + i % 5, generator="llm", llm_tokens=tokens[variant],
                                metrics={"faithfulness": overall}))
    return rows


def test_cost_is_the_mean_of_each_answers_tokens_at_the_configured_prices() -> None:
    observations = _observations(100, {"control": 0.7, "candidate": 0.7},
                                 {"control": {"prompt": 1000, "completion": 100},
                                  "candidate": {"prompt": 2000, "completion": 300}})
    priced = report(EXPERIMENT, observations, Prices(prompt=0.5, completion=1.5))
    control, candidate = priced.variants
    assert control.cost_usd == 0.65 and candidate.cost_usd == 1.45  # 1.0*0.5 + 0.1*1.5; 2.0*0.5 + 0.3*1.5
    assert candidate.tokens_mean == {"prompt": 2000.0, "completion": 300.0}
    unpriced = report(EXPERIMENT, observations)
    assert unpriced.variants[0].cost_usd is None and unpriced.variants[0].tokens_mean is not None
    extractive = Observation(variant="control", unit="u", overall=0.5, answered=True, queued=False, decision=None,
                             latency_ms=1.0, generator="extractive", metrics={})
    assert answer_cost(extractive, Prices()) == 0.0


def test_the_decision_names_its_evidence() -> None:
    tokens = {"control": {"prompt": 1, "completion": 1}, "candidate": {"prompt": 1, "completion": 1}}
    better = report(EXPERIMENT, _observations(400, {"control": 0.70, "candidate": 0.80}, tokens))
    assert better.decision == "candidate_wins" and "overall better" in better.decision_reason
    assert [c.metric for c in better.comparisons[:3]] == ["overall", "review_rate", "answered_rate"]
    same = report(EXPERIMENT, _observations(400, {"control": 0.75, "candidate": 0.75}, tokens))
    assert same.decision == "undecided" and "no significant difference" in same.decision_reason
