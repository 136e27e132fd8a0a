"""The review queue's order (pure). ``ReviewRepository`` sorts in SQL by the same formula
(``rag_service/db/repos/reviews.py``, ``_PRIORITY``); tests/review/test_priority.py checks that
the two agree on real rows.

Order: tier ``high`` first; within a tier, higher priority first; then older first; then id.

    priority = score_weight   * (1 - overall)                                      overall unknown: 1
             + traffic_weight * min(ln(1 + traffic) / ln(1 + traffic_cap), 1)
             + age_weight     * min(age_s / age_horizon_s, 1)

``traffic`` counts the queries with the same question hash in the item's collection in the last
``traffic_window_s`` (the item's own included): a question many people ask is worth fixing first. The log keeps the
traffic term from being swamped by one very popular question; the caps keep each term in [0, 1].
An answer nothing could judge counts as the worst score, as the gate treats it.
"""

from __future__ import annotations

import math
import uuid
from datetime import datetime

from rag_service.domain.review import PriorityPolicy, ReviewTier

DEFAULT_POLICY = PriorityPolicy()


def priority(*, overall: float | None, traffic: int, age_s: float, policy: PriorityPolicy = DEFAULT_POLICY) -> float:
    """The item's priority within its tier (higher first)."""
    score_term = 1.0 - (overall if overall is not None else 0.0)
    traffic_term = min(math.log1p(max(traffic, 0)) / math.log1p(policy.traffic_cap), 1.0)
    age_term = min(max(age_s, 0.0) / policy.age_horizon_s, 1.0)
    return policy.score_weight * score_term + policy.traffic_weight * traffic_term + policy.age_weight * age_term


def queue_key(*, tier: ReviewTier, priority: float, created_at: datetime,
              item_id: uuid.UUID) -> tuple[int, float, datetime, str]:
    """Sort key of the queue's order: ``sorted(items, key=...)`` lists them as the queue does
    (PostgreSQL orders uuids by their bytes, which is the order of their hex strings)."""
    return (0 if tier == "high" else 1, -priority, created_at, str(item_id))
