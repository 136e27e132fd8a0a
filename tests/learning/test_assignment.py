"""Sticky, salted assignment of units to prompt versions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import binomtest

from rag_service.domain.prompts import assignment_unit
from rag_service.learning.assignment import assign, bucket

UNITS = [assignment_unit(f"conv-{i}", None, f"q-{i}") for i in range(10_000)]
# The hash is deterministic, so each check below has one fixed outcome. The bar is the exact
# binomial test (scipy.stats.binomtest, two-sided) at p > 1e-4: a truly uniform hash misses it for
# one set of ids in 10,000, and at n = 10,000 (standard error 0.005 at share 0.5) a bias of 0.02 fails.
MISS = 1e-4


def test_the_same_conversation_keeps_its_variant() -> None:
    unit = assignment_unit("conv-7", "key-1", "q-1")
    again = assignment_unit("conv-7", "key-2", "q-2")  # another query, even another key, same conversation
    assert unit == again == "conversation:conv-7"
    assert {assign("exp-1", unit, 0.5) for _ in range(20)} == {assign("exp-1", again, 0.5)}


def test_the_unit_is_the_conversation_else_the_key_else_the_query() -> None:
    assert assignment_unit("c", "k", "q") == "conversation:c"
    assert assignment_unit(None, "k", "q") == "key:k"
    assert assignment_unit("", "k", "q") == "key:k"
    assert assignment_unit(None, None, "q") == "query:q"


def test_the_bucketing_never_changes() -> None:
    # Changing the hash would reshuffle every running experiment's units between the arms.
    assert bucket("exp-1", "conversation:42") == 0.7789466668002073


@pytest.mark.parametrize("share", [0.1, 0.5, 0.9])
def test_the_candidate_gets_its_share_of_units(share: float) -> None:
    candidates = sum(assign("exp-share", unit, share) == "candidate" for unit in UNITS)
    assert binomtest(candidates, len(UNITS), share).pvalue > MISS


def test_share_zero_and_one_are_all_control_and_all_candidate() -> None:
    assert {assign("exp-edge", unit, 0.0) for unit in UNITS} == {"control"}
    assert {assign("exp-edge", unit, 1.0) for unit in UNITS} == {"candidate"}


def test_different_experiments_split_independently() -> None:
    first = [assign("exp-a", unit, 0.5) for unit in UNITS]
    second = [assign("exp-b", unit, 0.5) for unit in UNITS]
    agree = sum(a == b for a, b in zip(first, second, strict=True))
    assert binomtest(agree, len(UNITS), 0.5).pvalue > MISS  # independent 50% splits agree half the time
    # and a 10% experiment takes its 10% out of both arms of the other one alike
    small = [assign("exp-c", unit, 0.1) == "candidate" for unit in UNITS]
    for arm in ("control", "candidate"):
        inside = [s for s, f in zip(small, first, strict=True) if f == arm]
        assert binomtest(sum(inside), len(inside), 0.1).pvalue > MISS


@pytest.mark.parametrize("share", [-0.01, 1.01, float("nan")])
def test_a_share_outside_zero_one_is_refused(share: float) -> None:
    with pytest.raises(ValueError, match=r"must be in \[0, 1\]"):
        assign("exp-1", "query:1", share)


@given(experiment=st.text(max_size=20), unit=st.text(max_size=40),
       shares=st.tuples(st.floats(0.0, 1.0), st.floats(0.0, 1.0)))
def test_buckets_are_in_range_and_raising_the_share_only_adds_candidates(
        experiment: str, unit: str, shares: tuple[float, float]) -> None:
    assert 0.0 <= bucket(experiment, unit) < 1.0
    low, high = sorted(shares)
    if assign(experiment, unit, low) == "candidate":
        assert assign(experiment, unit, high) == "candidate"
    assert assign(experiment, unit, low) == assign(experiment, unit, low)
