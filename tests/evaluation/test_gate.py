"""The promotion gate on a paired comparison: which regressions refuse a candidate, and the reason given."""

from __future__ import annotations

import re

import numpy as np
import pytest

from evaluation.compare import Comparison, compare
from evaluation.gate import gate
from tests.evaluation.test_compare import as_run, paired_runs

REASON = re.compile(r"^ndcg@10: (-0\.0\d+) \(95% CI (-0\.0\d+) to (-0\.0\d+), Holm p (0\.0\d*)\) "
                    r"worse than the tolerance 0\.01$")


def regressed() -> Comparison:
    run_a, run_b = paired_runs(np.random.default_rng(14), 2000, ["ndcg@10", "faithfulness", "latency_ms"],
                               shift={"ndcg@10": -0.03})
    return compare(run_a, run_b, lower_is_better={"latency_ms"})


def test_the_gate_fails_on_a_significant_regression_beyond_tolerance_and_names_it() -> None:
    result = regressed()
    decision = gate(result, tolerance=0.01)
    assert not decision.passed
    [failure] = decision.failures
    row = result.metric("ndcg@10")
    assert failure.metric == "ndcg@10"
    assert (failure.difference, failure.ci_low, failure.ci_high, failure.p_holm) == (
        row.difference, row.ci_low, row.ci_high, row.p_holm)
    shown = REASON.match(failure.reason)
    assert shown, failure.reason
    # The numbers themselves (three significant digits, two for p), not just their shape.
    for text, value in zip(shown.groups(), (row.difference, row.ci_low, row.ci_high, row.p_holm), strict=True):
        assert float(text) == pytest.approx(value, rel=0.05)
    assert decision.reason == failure.reason


def test_the_gate_passes_within_tolerance_and_defaults_unlisted_metrics_to_zero() -> None:
    result = regressed()
    assert gate(result, tolerance=0.05).passed
    assert gate(result, tolerance={"ndcg@10": 0.05}).passed
    assert not gate(result, tolerance={"faithfulness": 0.05}).passed  # ndcg@10 unlisted: tolerance 0
    with pytest.raises(ValueError, match=">= 0"):
        gate(result, tolerance=-0.01)


def test_the_gate_passes_a_regression_that_is_not_significant() -> None:
    # A mean regression of exactly 0.03 with an item-level sd of 0.3 over 40 items: standard error 0.047.
    z = np.random.default_rng(15).standard_normal(40)
    a = np.full(40, 0.6)
    b = a - 0.03 + 0.3 * (z - z.mean()) / z.std()
    result = compare(as_run({"ndcg@10": a}), as_run({"ndcg@10": b}))
    assert result.metric("ndcg@10").difference < -0.01 and not result.metric("ndcg@10").significant
    decision = gate(result, tolerance=0.0)
    assert decision.passed and decision.failures == ()
    assert "no metric of 1" in decision.reason


def test_the_gate_reads_lower_is_better_metrics_the_right_way_round() -> None:
    rng = np.random.default_rng(16)
    latency = rng.gamma(4.0, 100.0, 1000)
    slower = as_run({"latency_ms": latency + 50 + rng.normal(0, 30, 1000)})
    faster = as_run({"latency_ms": latency - 50 + rng.normal(0, 30, 1000)})
    base = as_run({"latency_ms": latency})
    decision = gate(compare(base, slower, lower_is_better={"latency_ms"}), tolerance={"latency_ms": 20})
    assert not decision.passed
    shown = re.match(r"^latency_ms: \+([\d.]+) \(95% CI \+([\d.]+) to \+([\d.]+), Holm p [\d.]+\) "
                     r"worse than the tolerance 20$", decision.reason)
    assert shown, decision.reason
    [failure] = decision.failures
    shown_delta, shown_low, shown_high = (float(x) for x in shown.groups())
    assert shown_delta == pytest.approx(failure.difference, abs=0.05) and 40 < shown_delta < 60
    assert (shown_low, shown_high) == pytest.approx((failure.ci_low, failure.ci_high), abs=0.05)
    assert gate(compare(base, faster, lower_is_better={"latency_ms"}), tolerance=0).passed
