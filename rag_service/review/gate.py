"""The tiered review gate (pure), as the design states it: overall >= 0.80 is delivered; 0.60-0.80
is delivered and queued; below 0.60 is queued with high priority. In hold mode an answer below
0.80 waits for a reviewer instead of being delivered."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from rag_service.domain import Evaluation, GateMode, GateVerdict, MetricName, ReviewTrigger


@dataclass(frozen=True)
class GatePolicy:
    deliver_at: float = 0.80
    high_priority_below: float = 0.60
    metric_thresholds: Mapping[str, float] = field(default_factory=dict)
    mode: GateMode = "deliver"
    # A supported, correct answer is what the service promises: one of these below its own
    # threshold is reviewed even when the other metrics carry the overall above the gate.
    always_review: tuple[str, ...] = ("faithfulness", "correctness")


def gate(evaluation: Evaluation, policy: GatePolicy) -> GateVerdict:
    """Whether the answer needs review, at which tier, and why. An answer nothing could judge
    (overall None) is queued: no grade is not a good grade. Reasons are given only for answers
    that need review; flagged metrics are always reported (judge-human agreement counts them)."""
    flagged: list[MetricName] = []
    reasons: list[str] = []
    for score in evaluation.scores:
        threshold = policy.metric_thresholds.get(score.metric)
        if threshold is not None and score.value is not None and score.value < threshold:
            flagged.append(score.metric)
            reasons.append(f"{score.metric}: {score.value:.2f} < {threshold:.2f}")
    overall = evaluation.overall
    critical = any(m in policy.always_review for m in flagged)
    if overall is not None and overall >= policy.deliver_at and not critical:
        return GateVerdict(needs_review=False, tier=None, flagged=tuple(flagged))
    if overall is None:
        reasons.insert(0, "overall: no metric could be judged")
    elif overall < policy.deliver_at:
        reasons.insert(0, f"overall: {overall:.2f} < {policy.deliver_at:.2f}")
    high = overall is None or overall < policy.high_priority_below
    return GateVerdict(needs_review=True, tier="high" if high else "normal", reasons=tuple(reasons),
                       flagged=tuple(flagged), hold=policy.mode == "hold")


def trigger_for(verdict: GateVerdict, evaluation: Evaluation) -> ReviewTrigger | None:
    """The queue entry a verdict asks for (None when the answer goes straight out)."""
    if not verdict.needs_review or verdict.tier is None:
        return None
    return ReviewTrigger(source="evaluator", tier=verdict.tier, reasons=verdict.reasons, flagged=verdict.flagged,
                         overall=evaluation.overall, held=verdict.hold)
