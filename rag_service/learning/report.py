"""An experiment's statistics and decision from its observations (pure).

Three metrics decide, each with the always-valid test of ``sequential.py`` on clusters (a
conversation's or key's answers): the overall score of graded answers (higher is better), the
review rate (lower is better) and the answered rate (higher is better: a candidate must not win by
declining the hard questions, whose "does not answer" carries no grade). Each is tested at
alpha / 3 (Bonferroni), so the chance that any gives a false verdict stays within alpha however
often the report is read. Every answer the experiment assigned counts in its arm, fallbacks
included (intention to treat).

- **Guardrail:** the candidate is significantly worse on any of them: the experiment stops and
  all traffic returns to the control.
- **Win:** the candidate is significantly better on the overall score and worse on neither other.
- Otherwise undecided: keep collecting.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from rag_service.db.repos.experiments import Observation
from rag_service.domain.costs import Prices, generation_cost
from rag_service.domain.prompts import Experiment, ExperimentReport, MetricComparison, VariantStats
from rag_service.learning.sequential import better, clustered_test, worse

BURN_IN = 20  # observations per variant before the test may decide
# ... from at least this many conversations or keys: with fewer the cluster-robust variance is too
# small (benchmarks/experiment_clusters.py: 10 units per arm rejected 2.4% of A/A experiments at alpha 1.7%).
MIN_UNITS = 15
DECIDING = (("overall", True), ("review_rate", False), ("answered_rate", True))


def _value(observation: Observation, metric: str) -> float | None:
    if metric == "overall":
        return observation.overall
    if metric == "review_rate":
        return 1.0 if observation.queued else 0.0
    if metric == "answered_rate":
        return 1.0 if observation.answered else 0.0
    return observation.metrics.get(metric)


def compare(observations: Sequence[Observation], metric: str, higher_is_better: bool, *, alpha: float,
            tau: float) -> MetricComparison:
    rows = [(o.variant == "candidate", v, o.unit) for o in observations if (v := _value(o, metric)) is not None]
    is_candidate = np.array([r[0] for r in rows], dtype=bool)
    values = np.array([r[1] for r in rows], dtype=float)
    # One conversation's or key's answers are alike and all in one arm: test them as clusters.
    result = clustered_test(values, is_candidate, [r[2] for r in rows], alpha=alpha, tau=tau, burn_in=BURN_IN,
                            min_units=MIN_UNITS)
    verdict: Literal["better", "worse", "undecided"] = (
        "better" if better(result, higher_is_better) else "worse" if worse(result, higher_is_better) else "undecided")

    def finite(x: float) -> float | None:
        return None if not np.isfinite(x) else round(float(x), 4)

    return MetricComparison(
        metric=metric, higher_is_better=higher_is_better,
        control_mean=finite(result.mean_control) if result.n_control else None,
        candidate_mean=finite(result.mean_candidate) if result.n_candidate else None,
        difference=finite(result.difference) if result.n_control and result.n_candidate else None,
        lower=finite(result.lower), upper=finite(result.upper), p_value=round(float(result.p_value), 6),
        verdict=verdict)


def answer_cost(observation: Observation, prices: Prices) -> float | None:
    """An answer's generation cost: 0 without an LLM call; None when the LLM's tokens or the prices
    are unknown."""
    return generation_cost(observation.generator, observation.llm_tokens, prices)


def variant_stats(observations: Sequence[Observation], variant: Literal["control", "candidate"], label: str,
                  version: int, prices: Prices | None = None) -> VariantStats:
    mine = [o for o in observations if o.variant == variant]
    overall = np.array([o.overall for o in mine if o.overall is not None], dtype=float)
    metrics = sorted({m for o in mine for m in o.metrics})
    decided = [o.decision for o in mine if o.decision is not None]
    latencies = np.array([o.latency_ms for o in mine if o.latency_ms is not None], dtype=float)
    histogram = np.histogram(np.clip(overall, 0, 1), bins=10, range=(0, 1))[0] if overall.size else np.zeros(10)
    return VariantStats(
        variant=variant, label=label, version=version, answers=len(mine), graded=int(overall.size),
        overall_mean=round(float(overall.mean()), 4) if overall.size else None,
        metric_means={m: round(float(np.mean([o.metrics[m] for o in mine if m in o.metrics])), 4) for m in metrics},
        review_rate=round(sum(o.queued for o in mine) / len(mine), 4) if mine else None,
        approval_rate=round(decided.count("approved") / len(decided), 4) if decided else None,
        latency_ms_p50=round(float(np.percentile(latencies, 50)), 1) if latencies.size else None,
        latency_ms_p95=round(float(np.percentile(latencies, 95)), 1) if latencies.size else None,
        tokens_mean={k: round(float(np.mean([o.llm_tokens.get(k, 0) for o in metered])), 1)
                     for k in ("prompt", "completion")} if (metered := [o for o in mine if o.llm_tokens]) else None,
        cost_usd=round(sum(costs) / len(costs), 6) if mine and None not in (costs := [
            answer_cost(o, prices or Prices()) for o in mine]) else None,
        overall_histogram=[int(x) for x in histogram])


def report(experiment: Experiment, observations: Sequence[Observation], prices: Prices | None = None
           ) -> ExperimentReport:
    alpha = experiment.alpha / len(DECIDING)  # Bonferroni over the deciding metrics
    comparisons = [compare(observations, metric, higher, alpha=alpha, tau=experiment.tau)
                   for metric, higher in DECIDING]
    for metric in sorted({m for o in observations for m in o.metrics}):
        comparisons.append(compare(observations, metric, True, alpha=alpha, tau=experiment.tau))
    overall, review_rate = comparisons[0], comparisons[1]
    deciding = comparisons[:len(DECIDING)]
    if any(c.verdict == "worse" for c in deciding):
        bad = [c for c in deciding if c.verdict == "worse"]
        decision: Literal["candidate_wins", "candidate_worse", "undecided"] = "candidate_worse"
        reason = "; ".join(f"{c.metric} worse: {c.candidate_mean} vs {c.control_mean} (always-valid p "
                           f"{c.p_value:.4f} <= {alpha:.4f})" for c in bad)
    elif overall.verdict == "better":
        decision = "candidate_wins"
        reason = (f"overall better: {overall.candidate_mean} vs {overall.control_mean} (always-valid p "
                  f"{overall.p_value:.4f} <= {alpha:.4f}); review and answered rates not worse")
    else:
        decision = "undecided"
        reason = (f"no significant difference yet on overall (p {overall.p_value:.4f}) or review rate "
                  f"(p {review_rate.p_value:.4f}); {alpha:.4f} is needed")
    return ExperimentReport(
        experiment=experiment, comparisons=comparisons, decision=decision, decision_reason=reason,
        variants=[variant_stats(observations, "control", experiment.control_label, experiment.control_version,
                                prices),
                  variant_stats(observations, "candidate", experiment.candidate_label, experiment.candidate_version,
                                prices)])
