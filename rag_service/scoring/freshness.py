"""Freshness: how recent are the documents the answer cites?

Each cited document's date (its effective date, else when it was last updated) decays with a
configurable half-life: 1.0 today, 0.5 one half-life ago. The value is the mean over the cited
contexts that carry a date (all contexts when the answer cites none); None when none has a date.
"""

from __future__ import annotations

from datetime import UTC, datetime

from rag_service.domain import MetricScore
from rag_service.scoring.evidence import LOCAL_SCORER, ScoringInput

DEFAULT_HALF_LIFE_DAYS = 365.0


def decay(age_days: float, half_life_days: float) -> float:
    """Exponential decay: 0.5 ** (age / half-life); a date in the future counts as today."""
    return 0.5 ** (max(0.0, age_days) / half_life_days)


def score(inp: ScoringInput, half_life_days: float = DEFAULT_HALF_LIFE_DAYS) -> MetricScore:
    now = inp.now or datetime.now(UTC)
    chosen = inp.cited or list(range(len(inp.contexts)))
    dates = [inp.contexts[i].effective_date for i in chosen if inp.contexts[i].effective_date is not None]
    if not dates:
        return MetricScore(metric="freshness", value=None, scorer=LOCAL_SCORER,
                           reason="none of the sources it relies on carries a date.")
    ages = [(now - (d if d.tzinfo else d.replace(tzinfo=UTC))).total_seconds() / 86_400 for d in dates]
    value = sum(decay(a, half_life_days) for a in ages) / len(ages)
    oldest = max(ages)
    reason = (f"{len(ages)} dated source(s), the oldest {oldest:.0f} days old "
              f"(half-life {half_life_days:.0f} days)")
    return MetricScore(metric="freshness", value=round(value, 4), reason=reason + ".", scorer=LOCAL_SCORER)
