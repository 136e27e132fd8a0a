"""One score per metric from the local scorer, the LLM judge and ragas (pure).

Where the judge and ragas both scored a metric: 60% judge, 40% ragas (the judge reads the whole
answer with its question; ragas checks statement by statement, and the two err differently).
Where one scored it: that one. Where neither did: the local score, with why the LLM graders did
not score it added to its reason.
"""

from __future__ import annotations

from collections.abc import Sequence

from rag_service.domain import METRICS, MetricName, MetricScore
from rag_service.scoring.judge import JUDGED_METRICS

JUDGE_WEIGHT = 0.6
RAGAS_WEIGHT = 1 - JUDGE_WEIGHT


def _by_metric(scores: Sequence[MetricScore], source: str) -> dict[MetricName, MetricScore]:
    found: dict[MetricName, MetricScore] = {}
    for s in scores:
        if s.metric in found:
            raise ValueError(f"{source} scores {s.metric} twice")
        found[s.metric] = s
    return found


def _blend(judge: MetricScore, ragas: MetricScore) -> MetricScore:
    assert judge.value is not None and ragas.value is not None  # the caller checked
    low, high = sorted((judge.value, ragas.value))
    # Clamped: floating-point rounding must not put the blend outside the two values it blends.
    value = min(high, max(low, JUDGE_WEIGHT * judge.value + RAGAS_WEIGHT * ragas.value))
    return MetricScore(
        metric=judge.metric, value=value, scorer=f"{judge.scorer}+{ragas.scorer}",
        reason=(f"{JUDGE_WEIGHT:.0%} judge ({judge.value:.2f}: {judge.reason.rstrip('.')}) + "
                f"{RAGAS_WEIGHT:.0%} ragas ({ragas.value:.2f}: {ragas.reason.rstrip('.')})"),
    )


def _with_note(score: MetricScore, note: str) -> MetricScore:
    return score.model_copy(update={"reason": f"{score.reason.rstrip('.')} ({note})"})


def combine(local: Sequence[MetricScore], judge: Sequence[MetricScore], ragas: Sequence[MetricScore],
            notes: Sequence[str] = ()) -> list[MetricScore]:
    """All seven metrics, in ``METRICS`` order. ``local`` must score each of them; ``notes`` say
    why the LLM graders did not score, and are added to the local reason of each metric the judge
    covers when the judge gave no scores at all (it failed)."""
    own = _by_metric(local, "the local scorer")
    judged = _by_metric(judge, "the judge")
    checked = _by_metric(ragas, "ragas")
    missing = [m for m in METRICS if m not in own]
    if missing:
        raise ValueError(f"the local scores lack {missing}; combine needs all seven metrics")
    fallback = "; ".join(n.strip() for n in notes if n.strip())
    combined: list[MetricScore] = []
    for metric in METRICS:
        j, r = judged.get(metric), checked.get(metric)
        j_value = j is not None and j.value is not None
        r_value = r is not None and r.value is not None
        if j_value and r_value:
            combined.append(_blend(j, r))
        elif j_value or r_value:
            combined.append(j if j_value else r)
        elif j is not None:  # the judge said why it could not judge this one
            combined.append(_with_note(own[metric], f"the LLM judge could not judge it: {j.reason.rstrip('.')}"))
        elif not judged and fallback and metric in JUDGED_METRICS:
            combined.append(_with_note(own[metric], f"local score kept: {fallback}"))
        else:
            combined.append(own[metric])
    return combined
