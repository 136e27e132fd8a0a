"""The promotion gate on a paired comparison of two evaluation runs (``compare.py``): whether run B
(the candidate) may replace run A (production), and if not, which metrics regressed by how much."""

from __future__ import annotations

import math
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict

from evaluation.compare import Comparison


class GateFailure(BaseModel):
    model_config = ConfigDict(frozen=True)

    metric: str
    difference: float  # B - A, in the metric's units
    ci_low: float
    ci_high: float
    p_holm: float
    tolerance: float
    reason: str


class GateDecision(BaseModel):
    model_config = ConfigDict(frozen=True)

    passed: bool
    failures: tuple[GateFailure, ...]
    reason: str  # one line: the failures' reasons, or why it passed



def _number(value: float, *, digits: int = 3, signed: bool = False) -> str:
    """``digits`` significant digits without an exponent (a latency delta of 1234 ms stays 1234, not
    1.23e+03), trailing zeros dropped: the numbers are read next to a tolerance in the same units."""
    if value == 0.0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    text = f"{value:{'+' if signed else ''}.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _tolerance_for(metric: str, tolerance: Mapping[str, float] | float) -> float:
    # A metric without a configured tolerance gets none: any significant regression on it fails.
    return float(tolerance) if isinstance(tolerance, int | float) else float(tolerance.get(metric, 0.0))


def gate(comparison: Comparison, *, tolerance: Mapping[str, float] | float) -> GateDecision:
    """The promotion gate: B may replace A unless some metric is significantly worse (Holm-adjusted
    p <= 1 - confidence) and its mean regression is larger than the tolerance, an absolute amount in
    the metric's units (one for all metrics, or per metric; a metric missing from the mapping has
    tolerance 0). Regressions that are not significant never fail the gate: they are noise at this
    sample size."""
    values = [tolerance] if isinstance(tolerance, int | float) else list(tolerance.values())
    if any(not math.isfinite(t) or t < 0 for t in values):
        raise ValueError(f"tolerances are absolute amounts in the metric's units and must be >= 0; got {tolerance!r}")
    level = f"{_number(comparison.confidence * 100, digits=4)}% CI"
    failures = []
    for result in comparison.metrics:
        if result.direction != "worse" or result.difference is None:
            continue
        allowed = _tolerance_for(result.metric, tolerance)
        regression = -result.difference if result.higher_is_better else result.difference
        if regression <= allowed:
            continue
        assert result.ci_low is not None and result.ci_high is not None and result.p_holm is not None
        reason = (f"{result.metric}: {_number(result.difference, signed=True)} ({level} "
                  f"{_number(result.ci_low, signed=True)} to {_number(result.ci_high, signed=True)}, "
                  f"Holm p {_number(result.p_holm, digits=2)}) worse than the tolerance {_number(allowed)}")
        failures.append(GateFailure(metric=result.metric, difference=result.difference, ci_low=result.ci_low,
                                    ci_high=result.ci_high, p_holm=result.p_holm, tolerance=allowed, reason=reason))
    if failures:
        return GateDecision(passed=False, failures=tuple(failures), reason="; ".join(f.reason for f in failures))
    compared = [m for m in comparison.metrics if m.n > 0]
    return GateDecision(passed=True, failures=(), reason=(
        f"no metric of {len(compared)} is significantly worse beyond its tolerance "
        f"(Holm-adjusted, alpha {_number(1 - comparison.confidence, digits=2)})"))
