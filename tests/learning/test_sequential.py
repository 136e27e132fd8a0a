"""The always-valid mSPRT: its error rates in simulation, and agreement with the formula by hand."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_service.learning.sequential import (
    _draw,
    _log_lambda,
    _p_value,
    better,
    clustered_test,
    sequential_test,
    simulate,
    worse,
)


def scores(seed: int, n: int, control: float, candidate: float, sd: float = 0.15) -> tuple[np.ndarray, np.ndarray]:
    """n arrivals, each arm with probability 1/2, Beta scores with these means and sd."""
    rng = np.random.default_rng(seed)
    arm = rng.random(n) < 0.5
    values = np.empty(n)
    for mask, mean in ((~arm, control), (arm, candidate)):
        k = mean * (1 - mean) / sd**2 - 1
        values[mask] = rng.beta(mean * k, (1 - mean) * k, int(mask.sum()))
    return values, arm


def test_a_a_experiments_keep_the_false_positive_rate_below_alpha() -> None:
    # 10,000 experiments with no difference, 2,000 arrivals each (about 1,000 per arm), looked at
    # after every 20 arrivals and stopped at the first p <= 0.05.
    result = simulate(10_000, max_per_arm=1000, look_every=20, effect=0.0)
    print(f"\nA/A: false-positive rate {result.rejection_rate:.4f} over {result.n_experiments} experiments "
          f"of {result.max_arrivals} arrivals")
    assert result.max_arrivals == 2000
    assert result.rejection_rate <= 0.05


def test_a_b_experiments_find_a_drop_of_0_05_in_the_right_direction() -> None:
    # 600 arrivals (about 300 per arm) is where the power passes 0.8; at 2,000 it is 1.0.
    result = simulate(10_000, max_per_arm=300, look_every=20, effect=-0.05)
    print(f"\nA/B, effect -0.05: power {result.rejection_rate:.4f} within {result.max_arrivals} arrivals, "
          f"median {result.median_arrivals} arrivals to detection, direction right in "
          f"{result.direction_correct_rate:.4f}")
    assert result.rejection_rate >= 0.8
    assert result.direction_correct_rate is not None and result.direction_correct_rate >= 0.99
    assert result.median_arrivals is not None and result.median_arrivals < result.max_arrivals


@pytest.mark.parametrize(("kind", "effect"), [("beta", -0.08), ("bernoulli", -0.3)])
def test_the_simulation_runs_the_same_test_as_sequential_test(kind: str, effect: float) -> None:
    # Looking after every arrival, the simulation must reject exactly the experiments that
    # sequential_test finds significant on the same draws (effects chosen to reject some, not all).
    n, per_arm = 300, 100
    result = simulate(n, max_per_arm=per_arm, look_every=1, effect=effect, seed=3, scores=kind)
    rng = np.random.default_rng(3)
    blocks = [_draw(rng, (n, 1), effect, 0.5, kind) for _ in range(result.max_arrivals)]
    values, arms = np.hstack([b[0] for b in blocks]), np.hstack([b[1] for b in blocks])
    significant = sum(sequential_test(v, a).significant for v, a in zip(values, arms, strict=True))
    print(f"\n{kind}: {significant} of {n} significant")
    assert 0.1 * n < significant < 0.9 * n
    assert result.rejected == significant


def hand_log_lambda(values: list[float], arms: list[bool], tau: float, floor: float) -> tuple[float, float, float]:
    """ln Lambda, difference and V at one prefix, in plain Python from the paper's formula."""
    control = [v for v, a in zip(values, arms, strict=True) if not a]
    candidate = [v for v, a in zip(values, arms, strict=True) if a]
    v = (max(statistics.variance(candidate), floor) / len(candidate)
         + max(statistics.variance(control), floor) / len(control))
    d = statistics.fmean(candidate) - statistics.fmean(control)
    lam = math.sqrt(v / (v + tau**2)) * math.exp(d**2 * tau**2 / (2 * v * (v + tau**2)))
    return math.log(lam), d, v


def test_sequential_test_matches_the_formula_by_hand_and_the_shared_function() -> None:
    values, arms = scores(0, 160, 0.75, 0.70)
    alpha, tau, burn_in, floor = 0.05, 0.05, 20, 1e-4
    result = sequential_test(values, arms, alpha=alpha, tau=tau, burn_in=burn_in, variance_floor=floor)
    assert 0.01 < result.p_value < 1.0

    by_hand, by_shared, lowers, uppers = [], [], [], []
    for k in range(1, len(values) + 1):
        x, a = values[:k].tolist(), arms[:k].tolist()
        if min(sum(a), k - sum(a)) < burn_in:
            continue
        log_lam, d, v = hand_log_lambda(x, a, tau, floor)
        half = math.sqrt(v * (v + tau**2) / tau**2 * (2 * math.log(1 / alpha) + math.log((v + tau**2) / v)))
        by_hand.append(min(1.0, 1.0 / math.exp(log_lam)))
        lowers.append(d - half)
        uppers.append(d + half)
        c, t = values[:k][~arms[:k]], values[:k][arms[:k]]
        shared = _log_lambda(np.array(len(c)), np.array(c.mean()), np.array(c.var(ddof=1)), np.array(len(t)),
                             np.array(t.mean()), np.array(t.var(ddof=1)), tau=tau, variance_floor=floor)
        by_shared.append(float(_p_value(shared)))
        if k == 100:  # one prefix checked on its own, not only through the minimum
            assert float(shared) == pytest.approx(log_lam, rel=1e-12)
    assert len(by_hand) > 50
    assert result.p_value == pytest.approx(min(by_hand), rel=1e-9)
    assert result.p_value == pytest.approx(min(by_shared), rel=1e-9)
    assert result.lower == pytest.approx(max(lowers), rel=1e-9)
    assert result.upper == pytest.approx(min(uppers), rel=1e-9)
    assert result.difference == pytest.approx(values[arms].mean() - values[~arms].mean(), rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 200), cut=st.integers(0, 200),
       difference=st.floats(-0.25, 0.25))
def test_a_prefix_never_has_a_smaller_p_value_or_a_narrower_sequence(seed: int, n: int, cut: int,
                                                                     difference: float) -> None:
    # Seeded Beta scores rather than raw floats: hypothesis' small, repetitive lists almost never
    # reach p < 1, and then the running minimum would go untested.
    values, arms = scores(seed, n, 0.7, 0.7 + difference)
    whole = sequential_test(values, arms, burn_in=5)
    part = sequential_test(values[:cut], arms[:cut], burn_in=5)
    assert part.p_value >= whole.p_value
    assert part.lower <= whole.lower and part.upper >= whole.upper
    # significance is the same event as zero leaving the running intersection
    assert whole.significant == (not whole.lower < 0.0 < whole.upper)
    assert sequential_test(values, arms, burn_in=5) == whole  # stateless


def test_a_clearly_worse_candidate_is_worse_and_not_better() -> None:
    values, arms = scores(1, 600, 0.8, 0.6)
    result = sequential_test(values, arms)
    assert result.n_control + result.n_candidate == 600 and min(result.n_control, result.n_candidate) > 250
    assert result.significant and result.upper < 0.0
    assert worse(result) and not better(result)
    # when lower is better (a latency, a review rate) the same data favour the candidate
    assert better(result, higher_is_better=False) and not worse(result, higher_is_better=False)


def test_a_clearly_higher_review_rate_in_0_1_outcomes_is_found() -> None:
    rng = np.random.default_rng(2)
    arms = np.arange(800) % 2 == 1
    sent_to_review = (rng.random(800) < np.where(arms, 0.35, 0.15)).astype(float)
    result = sequential_test(sent_to_review, arms)
    assert worse(result, higher_is_better=False) and not better(result, higher_is_better=False)


def test_identical_arms_are_not_significant() -> None:
    values, arms = scores(4, 100, 0.75, 0.75)
    result = sequential_test(values, arms)
    assert min(result.n_control, result.n_candidate) >= 40
    assert not result.significant and result.lower < 0.0 < result.upper
    assert not worse(result) and not better(result)


def test_below_burn_in_nothing_is_concluded() -> None:
    values, arms = scores(5, 60, 0.9, 0.1)  # a huge difference, but under 40 in some arm
    result = sequential_test(values, arms, burn_in=40)
    assert (result.p_value, result.lower, result.upper, result.significant) == (1.0, -math.inf, math.inf, False)
    assert result.difference is not None and result.difference < -0.5
    empty = sequential_test([], [])
    assert (empty.n_control, empty.mean_control, empty.difference, empty.p_value) == (0, None, None, 1.0)


def test_equal_scores_in_both_arms_give_p_one_not_nan() -> None:
    # Both sample variances are 0: the variance floor keeps V > 0.
    result = sequential_test([0.8] * 60, [i % 2 == 0 for i in range(60)])
    assert result.p_value == 1.0 and not result.significant
    assert result.lower < 0.0 < result.upper


@pytest.mark.parametrize(("args", "kwargs", "message"), [
    (([0.5, 0.6], [True]), {}, "equally long"),
    (([0.5, 0.6], [2, 0]), {}, "booleans"),
    (([0.5, float("nan")], [True, False]), {}, "finite"),
    (([0.5], [True]), {"alpha": 1.0}, "alpha"),
    (([0.5], [True]), {"alpha": 0.0}, "alpha"),
    (([0.5], [True]), {"tau": 0.0}, "tau"),
    (([0.5], [True]), {"burn_in": 1}, "burn_in"),
    (([0.5], [True]), {"variance_floor": 0.0}, "variance_floor"),
])
def test_bad_inputs_are_refused_with_what_to_fix(args: tuple, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sequential_test(*args, **kwargs)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"share": 1.0}, "share"),
    ({"max_per_arm": 10}, "burn_in"),
    ({"look_every": 0}, "look_every"),
    ({"scores": "normal"}, "scores"),
    ({"effect": 0.3}, "Beta"),
])
def test_bad_simulations_are_refused(kwargs: dict, message: str) -> None:
    arguments = {"n_experiments": 10, "max_per_arm": 100, "look_every": 20, "effect": 0.0} | kwargs
    with pytest.raises(ValueError, match=message):
        simulate(**arguments)


def test_the_clustered_test_keeps_its_level_when_answers_come_in_sticky_units() -> None:
    """Assignment is sticky per conversation or key, and one unit's answers are alike: treated as
    independent they reject far too often; the cluster-robust test keeps the level."""
    rng = np.random.default_rng(3)
    clustered = plain = 0
    experiments, alpha = 200, 0.05
    for _ in range(experiments):
        level = rng.normal(0.0, 0.05, 60)
        unit_arm = rng.permutation(np.arange(60) % 2 == 1)
        unit = rng.integers(0, 60, 600)
        x = np.clip(0.75 + level[unit] + rng.normal(0.0, 0.15, 600), 0.0, 1.0)
        clustered += clustered_test(x, unit_arm[unit], unit, alpha=alpha, min_units=20).significant
        plain += sequential_test(x, unit_arm[unit], alpha=alpha).significant
    print(f"A/A with 60 sticky units: clustered {clustered / experiments:.3f}, plain {plain / experiments:.3f}")
    assert clustered / experiments <= alpha
    assert plain / experiments > 2 * alpha  # why the clustered test exists


def test_the_clustered_test_waits_for_enough_units() -> None:
    x = np.linspace(0, 1, 400)
    arm = np.arange(400) % 2 == 1
    few = clustered_test(x + 0.3 * arm, arm, np.arange(400) % 8, min_units=10)  # 4 units per arm
    assert (few.p_value, few.significant) == (1.0, False)
    many = clustered_test(np.clip(x * 0 + 0.5 + 0.3 * arm + np.sin(np.arange(400)) * 0.1, 0, 1), arm,
                          np.arange(400) % 100, min_units=10)
    assert many.significant and many.lower > 0
