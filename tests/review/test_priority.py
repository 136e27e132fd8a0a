"""The queue's priority: the pure formula, and the repository's SQL ordering agreeing with it on
real rows (scores, traffic, ages and tiers mixed)."""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime

import pytest

from rag_service.db.engine import Database
from rag_service.db.repos.reviews import ReviewRepository
from rag_service.domain.review import PriorityPolicy, ReviewFilters
from rag_service.review.priority import DEFAULT_POLICY, priority, queue_key
from tests.review.seed import add_traffic, backdate, seed_answer


def test_each_term_raises_the_priority() -> None:
    base = priority(overall=0.7, traffic=1, age_s=60)
    assert priority(overall=0.3, traffic=1, age_s=60) > base
    assert priority(overall=0.7, traffic=20, age_s=60) > base
    assert priority(overall=0.7, traffic=1, age_s=86_400) > base
    # Unknown overall counts as the worst score, as the gate treats it.
    assert priority(overall=None, traffic=1, age_s=60) == priority(overall=0.0, traffic=1, age_s=60)


def test_terms_saturate_at_their_caps() -> None:
    p = DEFAULT_POLICY
    assert priority(overall=0.0, traffic=p.traffic_cap, age_s=p.age_horizon_s) == pytest.approx(1.0)
    assert priority(overall=0.0, traffic=10 * p.traffic_cap, age_s=10 * p.age_horizon_s) == pytest.approx(1.0)
    assert priority(overall=1.0, traffic=0, age_s=0) == 0.0
    half = priority(overall=1.0, traffic=0, age_s=p.age_horizon_s / 2)
    assert half == pytest.approx(p.age_weight / 2)
    assert priority(overall=1.0, traffic=9, age_s=0) == pytest.approx(p.traffic_weight * math.log(10) / math.log(101))


def test_queue_key_puts_the_high_tier_first_then_priority_then_age() -> None:
    old, new = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC)
    a = uuid.UUID(int=1)
    keys = {
        "normal-urgent": queue_key(tier="normal", priority=0.9, created_at=new, item_id=a),
        "high-calm": queue_key(tier="high", priority=0.1, created_at=new, item_id=a),
        "normal-old": queue_key(tier="normal", priority=0.5, created_at=old, item_id=a),
        "normal-new": queue_key(tier="normal", priority=0.5, created_at=new, item_id=a),
    }
    assert sorted(keys, key=keys.__getitem__) == ["high-calm", "normal-urgent", "normal-old", "normal-new"]


@pytest.mark.parametrize("policy", [DEFAULT_POLICY, PriorityPolicy(score_weight=0.1, traffic_weight=0.6,
                                                                    age_weight=0.3, traffic_cap=5,
                                                                    age_horizon_s=3_600)])
async def test_the_sql_order_mirrors_the_formula(database: Database, policy: PriorityPolicy) -> None:
    collection = f"prio-{uuid.uuid4().hex[:8]}"
    cases = [  # (tier, overall, extra traffic, age in seconds)
        ("normal", 0.75, 0, 10), ("normal", 0.65, 0, 10), ("normal", 0.75, 30, 10), ("normal", 0.75, 0, 5 * 86_400),
        ("high", 0.55, 0, 10), ("high", None, 3, 100), ("high", 0.2, 0, 2 * 86_400), ("normal", 0.7, 200, 600),
        ("normal", 0.7, 0, 9 * 86_400), ("high", 0.59, 1, 1_800),
    ]
    for i, (tier, overall, traffic, age) in enumerate(cases):
        question_hash = f"{collection}-{i}"
        _, review_id = await seed_answer(database, collection=collection, tier=tier, overall=overall,
                                         question_hash=question_hash)
        assert review_id is not None
        await add_traffic(database, question_hash, traffic, collection)
        await add_traffic(database, question_hash, 5, collection, age_s=policy.traffic_window_s + 3_600)  # too old
        await add_traffic(database, question_hash, 4, f"{collection}-other")  # another collection's question
        await backdate(database, review_id, age)

    items, total = await ReviewRepository(database, policy).list(ReviewFilters(collection=collection), limit=50)
    assert total == len(cases) == len(items)
    for item in items:
        assert item.priority == pytest.approx(
            priority(overall=item.overall, traffic=item.traffic, age_s=item.age_s, policy=policy), abs=1e-9)
    by_formula = sorted(items, key=lambda i: queue_key(
        tier=i.tier, priority=priority(overall=i.overall, traffic=i.traffic, age_s=i.age_s, policy=policy),
        created_at=i.created_at, item_id=i.id))
    assert [i.id for i in items] == [i.id for i in by_formula]
    # Traffic counts the item's own query and the recent ones in its collection only.
    assert sorted(i.traffic for i in items) == sorted(1 + c[2] for c in cases)
