"""The review queue's statistics (pure): the repository's raw numbers summarised."""

from __future__ import annotations

from collections import Counter
from typing import get_args

import numpy as np

from rag_service.db.repos.reviews import StatsInputs
from rag_service.domain import METRICS, REVIEW_STATUSES, ReviewCategory
from rag_service.domain.review import (
    AgePercentiles,
    DecisionCounts,
    MetricAgreement,
    PromptDecisions,
    ReviewStats,
)
from rag_service.review.agreement import cohen_kappa

# What counts as "the reviewer found the answer wanting" for judge-human agreement.
CORRECTED = frozenset({"rejected", "edited"})


def _counts(counter: Counter[str]) -> dict[str, int]:
    return {"approved": counter["approved"], "rejected": counter["rejected"], "edited": counter["edited"],
            "total": sum(counter.values())}


def summarise(inputs: StatsInputs) -> ReviewStats:
    """Queue length by state; p50/p95 of how long open items have waited (numpy's default
    linear interpolation); decisions by category and by prompt version; per metric, Cohen's
    kappa between "the metric was flagged" and "the reviewer rejected or edited" over decided
    items (see ``rag_service.review.agreement``)."""
    ages = np.asarray(inputs.open_ages_s, dtype=np.float64)
    open_age = None
    if ages.size:
        p50, p95 = np.percentile(ages, [50, 95])
        open_age = AgePercentiles(p50=float(p50), p95=float(p95))

    by_category: dict[str, Counter[str]] = {c: Counter() for c in get_args(ReviewCategory)}
    by_prompt: dict[tuple[str | None, int | None], Counter[str]] = {}
    for decision, category, prompt_name, prompt_version, n in inputs.decisions:
        by_category.setdefault(category, Counter())[decision] += n
        by_prompt.setdefault((prompt_name, prompt_version), Counter())[decision] += n

    corrected = [decision in CORRECTED for _, decision in inputs.decided]
    agreement = {}
    for metric in METRICS:
        flagged = [metric in metrics for metrics, _ in inputs.decided]
        result = cohen_kappa(flagged, corrected)
        agreement[metric] = MetricAgreement(kappa=result.kappa, n=result.n, flagged=sum(flagged),
                                            corrected=sum(corrected))

    return ReviewStats(
        by_status={status: inputs.by_status.get(status, 0) for status in REVIEW_STATUSES},
        open_age_s=open_age,
        decisions_by_category={c: DecisionCounts(**_counts(counter)) for c, counter in by_category.items()},
        decisions_by_prompt=[PromptDecisions(prompt_name=name, prompt_version=version, **_counts(counter))
                             for (name, version), counter in by_prompt.items()],
        agreement=agreement,
    )
