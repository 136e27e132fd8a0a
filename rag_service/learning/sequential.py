"""An always-valid two-sample test for A/B experiments between prompt versions (pure, numpy).

Method: the mixture sequential probability ratio test (mSPRT) of Robbins (1970), "Statistical
methods related to the law of the iterated logarithm", Annals of Mathematical Statistics 41(5),
in the form of Johari, Koomen, Pekelis & Walsh (2022), "Always Valid Inference: Continuous
Monitoring of A/B Tests", Operations Research 70(3) (arXiv:1512.04922), section 4: a normal
mixture N(0, tau^2) over the true difference theta = mean(candidate) - mean(control) under H1,
against theta = 0 under H0. With the observed difference d and its plug-in variance
V = s_candidate^2 / n_candidate + s_control^2 / n_control (sample variances), the mixture
likelihood ratio is

    Lambda_n = sqrt(V / (V + tau^2)) * exp(d^2 tau^2 / (2 V (V + tau^2))).

Under H0 it is a nonnegative martingale of mean 1, so by Ville's inequality P(sup_n Lambda_n >= 1/alpha)
<= alpha: the p-value min(1, 1 / Lambda_n), minimised over every look so far, stays valid however
often and whenever the experiment is looked at, including stopping the first time it is small. The
matching confidence sequence for theta is the set where Lambda_n(theta) < 1/alpha,

    d +- sqrt(V (V + tau^2) / tau^2 * (2 ln(1/alpha) + ln((V + tau^2) / V))),

intersected over looks. tau is the scale of differences the test is tuned to find fastest (the
default 0.05 is a 0.05 change in a score on [0, 1]); any tau > 0 keeps the guarantee.

The normal likelihood is reached through the central limit theorem, so the same test serves
continuous scores in [0, 1] and binary outcomes (0/1, e.g. "sent to review"), whose mean is a rate;
``burn_in`` observations per arm come first, for the means to be near normal and the plug-in
variances to settle (benchmarks/experiment_power.py measures the false-positive rate this gives).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

Scores = Literal["beta", "bernoulli"]
SCORES: tuple[Scores, ...] = ("beta", "bernoulli")
# Simulated control scores: the overall score's typical mean and spread.
CONTROL_MEAN, SCORE_SD = 0.75, 0.15

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class SequentialResult:
    n_control: int
    n_candidate: int
    mean_control: float | None  # None: no observation in that arm
    mean_candidate: float | None
    difference: float | None  # candidate - control, on all observations
    p_value: float  # always valid: the minimum over every prefix with burn_in per arm
    lower: float  # the confidence sequence on the difference: the running intersection
    upper: float
    significant: bool  # p_value <= alpha
    alpha: float
    tau: float


@dataclass(frozen=True)
class SimulationResult:
    effect: float
    n_experiments: int
    max_arrivals: int  # arrivals (both arms) per experiment when nothing is found
    look_every: int
    rejected: int  # experiments whose p-value reached alpha at some look
    rejection_rate: float  # the false-positive rate when effect is 0, the power otherwise
    median_arrivals: float | None  # arrivals at the first rejecting look, over rejections
    direction_correct_rate: float | None  # share of rejections whose difference has the effect's sign


def _check_parameters(alpha: float, tau: float, burn_in: int, variance_floor: float) -> None:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha is the false-positive bound and must be in (0, 1), e.g. 0.05; got {alpha}")
    if not tau > 0.0:
        raise ValueError(f"tau is the scale of differences to detect and must be > 0, e.g. 0.05; got {tau}")
    if burn_in < 2:
        raise ValueError(f"burn_in must be >= 2: a sample variance needs two observations per arm; got {burn_in}")
    if not variance_floor > 0.0:
        raise ValueError(f"variance_floor must be > 0, e.g. 1e-4, or equal scores divide by zero; got {variance_floor}")


def _moments(count: FloatArray, total: FloatArray, total_sq: FloatArray,
             shift: FloatArray | float) -> tuple[FloatArray, FloatArray]:
    """Mean and sample variance (divisor n - 1) from running sums of y = x - shift, count >= 2.

    Summing the shifted data, with the shift one of the observations, is the shifted-data algorithm
    of Chan, Golub & LeVeque (1983), "Algorithms for computing the sample variance: analysis and
    recommendations", The American Statistician 37(3): sum(y^2) - sum(y)^2 / n then cancels only
    as much as the spread is small against the distance from the shift, not against the mean.
    """
    mean_y = total / count
    variance = (total_sq - total * mean_y) / (count - 1)
    return shift + mean_y, np.maximum(variance, 0.0)  # rounding can leave -1e-18 for equal values


def _difference_and_variance(n_control: FloatArray, mean_control: FloatArray, var_control: FloatArray,
                             n_candidate: FloatArray, mean_candidate: FloatArray, var_candidate: FloatArray,
                             variance_floor: float) -> tuple[FloatArray, FloatArray]:
    """The difference of means and its plug-in variance V. The floor keeps an arm whose first
    scores happen to be equal from claiming zero spread, which would make V = 0 and Lambda infinite."""
    variance = (np.maximum(var_candidate, variance_floor) / n_candidate
                + np.maximum(var_control, variance_floor) / n_control)
    return mean_candidate - mean_control, variance


def _log_lambda(n_control: FloatArray, mean_control: FloatArray, var_control: FloatArray,
                n_candidate: FloatArray, mean_candidate: FloatArray, var_candidate: FloatArray,
                *, tau: float, variance_floor: float) -> FloatArray:
    """ln Lambda_n of the normal-mixture SPRT (module docstring), elementwise. In logs because
    Lambda overflows a float once the difference is a few dozen standard errors."""
    difference, v = _difference_and_variance(n_control, mean_control, var_control,
                                             n_candidate, mean_candidate, var_candidate, variance_floor)
    tau2 = tau * tau
    return -0.5 * np.log1p(tau2 / v) + difference**2 * tau2 / (2.0 * v * (v + tau2))


def _half_width(v: FloatArray, *, alpha: float, tau: float) -> FloatArray:
    """Half-width of the confidence sequence at plug-in variance V: where Lambda_n(theta) = 1/alpha."""
    tau2 = tau * tau
    return np.sqrt(v * (v + tau2) / tau2 * (2.0 * math.log(1.0 / alpha) + np.log1p(tau2 / v)))


def _p_value(log_lambda: FloatArray | float) -> FloatArray:
    return np.exp(-np.maximum(log_lambda, 0.0))  # min(1, 1 / Lambda)


def sequential_test(values: ArrayLike, is_candidate: ArrayLike, *, alpha: float = 0.05, tau: float = 0.05,
                    burn_in: int = 20, variance_floor: float = 1e-4) -> SequentialResult:
    """The always-valid test of mean(candidate) - mean(control) on observations in arrival order.

    ``is_candidate`` says which arm each observation came from. Lambda is evaluated after every
    arrival at which both arms hold at least ``burn_in`` observations, and the result keeps the
    minimum p-value and the intersection of the confidence intervals over all of them. The function
    keeps no state: calling it again on more data repeats the earlier prefixes, so looking after any
    number of arrivals, as often as wanted, and stopping at the first significant look stays valid
    at level alpha. Before burn_in per arm: p 1.0, bounds -inf/+inf, not significant.

    An empty intersection (lower > upper: the data contradict themselves, which the guarantee allows
    with probability at most alpha) is significant but neither ``worse`` nor ``better``.
    """
    _check_parameters(alpha, tau, burn_in, variance_floor)
    x = np.asarray(values, dtype=np.float64)
    arm = np.asarray(is_candidate)
    if x.ndim != 1 or arm.shape != x.shape:
        raise ValueError(f"values and is_candidate must be 1-D and equally long, one arm per value: "
                         f"got shapes {x.shape} and {arm.shape}")
    if arm.dtype != np.bool_:
        if arm.size and not np.isin(arm, (0, 1)).all():
            raise ValueError("is_candidate must be booleans (or 0/1): True where the value came from the candidate")
        arm = arm.astype(np.bool_)
    if not np.isfinite(x).all():
        raise ValueError(f"values must be finite numbers: index {int(np.flatnonzero(~np.isfinite(x))[0])} is not")

    shift = float(x[0]) if x.size else 0.0
    y = x - shift
    running = [(np.cumsum(mask, dtype=np.float64), np.cumsum(np.where(mask, y, 0.0)),
                np.cumsum(np.where(mask, y * y, 0.0))) for mask in (~arm, arm)]
    (n_a, s_a, q_a), (n_c, s_c, q_c) = running
    n_control, n_candidate = int(n_a[-1]) if x.size else 0, int(n_c[-1]) if x.size else 0
    mean_control = shift + float(s_a[-1]) / n_control if n_control else None
    mean_candidate = shift + float(s_c[-1]) / n_candidate if n_candidate else None
    difference = None if mean_control is None or mean_candidate is None else mean_candidate - mean_control

    looks = (n_a >= burn_in) & (n_c >= burn_in)
    if not looks.any():
        return SequentialResult(n_control, n_candidate, mean_control, mean_candidate, difference, 1.0,
                                -math.inf, math.inf, False, alpha, tau)
    mean_a, var_a = _moments(n_a[looks], s_a[looks], q_a[looks], shift)
    mean_c, var_c = _moments(n_c[looks], s_c[looks], q_c[looks], shift)
    log_lambda = _log_lambda(n_a[looks], mean_a, var_a, n_c[looks], mean_c, var_c,
                             tau=tau, variance_floor=variance_floor)
    d, v = _difference_and_variance(n_a[looks], mean_a, var_a, n_c[looks], mean_c, var_c, variance_floor)
    half = _half_width(v, alpha=alpha, tau=tau)
    p_value = float(_p_value(log_lambda.max()))
    return SequentialResult(n_control, n_candidate, mean_control, mean_candidate, difference, p_value,
                            float((d - half).max()), float((d + half).min()), p_value <= alpha, alpha, tau)


def clustered_test(values: ArrayLike, is_candidate: ArrayLike, units: ArrayLike, *, alpha: float = 0.05,
                   tau: float = 0.05, burn_in: int = 20, min_units: int = 10, look_every: int = 10,
                   variance_floor: float = 1e-4) -> SequentialResult:
    """``sequential_test`` for observations that come in clusters: every observation of one
    assignment unit (a conversation, an API key) is in one arm, and a unit's answers are alike
    (the same user, the same kind of question), so they are not independent and the plain
    variance s^2/n understates the uncertainty (an A/A simulation with 20 keys rejected 20% of
    the time at alpha 0.025). V per arm is instead the cluster-robust (sandwich) variance of the
    mean with the small-sample factor G/(G-1) (Liang & Zeger 1986; Cameron & Miller 2015, "A
    practitioner's guide to cluster-robust inference", J. Human Resources 50(2)):
        V_arm = G/(G-1) * sum_g (sum_{i in g} (x_i - mean))^2 / n^2,
    plugged into the same mixture likelihood ratio. Looks are taken every ``look_every`` arrivals
    (and at the last), each once both arms hold ``burn_in`` observations from ``min_units`` units;
    the p-value is the minimum over them, as before (any subset of looks keeps the guarantee).
    """
    _check_parameters(alpha, tau, burn_in, variance_floor)
    if min_units < 2 or look_every < 1:
        raise ValueError(f"min_units must be >= 2 and look_every >= 1; got {min_units} and {look_every}")
    x = np.asarray(values, dtype=np.float64)
    arm = np.asarray(is_candidate, dtype=np.bool_)
    _, codes = np.unique(np.asarray(units, dtype=object).astype(str), return_inverse=True)
    if x.ndim != 1 or arm.shape != x.shape or codes.shape != x.shape:
        raise ValueError("values, is_candidate and units must be 1-D and equally long")
    if not np.isfinite(x).all():
        raise ValueError("values must be finite numbers")
    n = x.size
    plain = sequential_test(x, arm, alpha=alpha, tau=tau, burn_in=2, variance_floor=variance_floor) if n else None
    log_lambdas, lowers, uppers = [], [], []
    for t in sorted({*range(look_every, n + 1, look_every), n} - {0}):
        stats = []
        for mask in (~arm[:t], arm[:t]):
            xs, gs = x[:t][mask], codes[:t][mask]
            groups = np.unique(gs).size
            if xs.size < burn_in or groups < min_units:
                break
            mean = xs.mean()
            cluster_sums = np.bincount(gs, weights=xs - mean)
            var_mean = groups / (groups - 1) * float((cluster_sums ** 2).sum()) / xs.size ** 2
            stats.append((mean, max(var_mean, variance_floor / xs.size)))
        if len(stats) < 2:
            continue
        (mean_a, v_a), (mean_c, v_c) = stats
        d, v = mean_c - mean_a, v_a + v_c
        tau2 = tau * tau
        log_lambdas.append(-0.5 * math.log1p(tau2 / v) + d * d * tau2 / (2.0 * v * (v + tau2)))
        half = float(_half_width(np.array([v]), alpha=alpha, tau=tau)[0])
        lowers.append(d - half)
        uppers.append(d + half)
    n_control = int((~arm).sum())
    n_candidate = int(arm.sum())
    means = (plain.mean_control, plain.mean_candidate, plain.difference) if plain else (None, None, None)
    if not log_lambdas:
        return SequentialResult(n_control, n_candidate, *means, 1.0, -math.inf, math.inf, False, alpha, tau)
    p_value = float(_p_value(max(log_lambdas)))
    return SequentialResult(n_control, n_candidate, *means, p_value, max(lowers), min(uppers), p_value <= alpha,
                            alpha, tau)


def worse(result: SequentialResult, higher_is_better: bool = True) -> bool:
    """Significant, and the whole confidence sequence lies on the bad side of zero."""
    if not result.significant or result.lower > result.upper:
        return False
    return result.upper < 0.0 if higher_is_better else result.lower > 0.0


def better(result: SequentialResult, higher_is_better: bool = True) -> bool:
    """Significant, and the whole confidence sequence lies on the good side of zero."""
    return worse(result, higher_is_better=not higher_is_better)


def _beta_parameters(mean: float, sd: float) -> tuple[float, float]:
    """Beta(a, b) with this mean and sd, by the method of moments: a + b = m (1 - m) / sd^2 - 1."""
    concentration = mean * (1.0 - mean) / sd**2 - 1.0
    if not 0.0 < mean < 1.0 or concentration <= 0.0:
        raise ValueError(f"no Beta distribution has mean {mean} and sd {sd}: the mean must be in (0, 1) "
                         f"and sd^2 below mean (1 - mean)")
    return mean * concentration, (1.0 - mean) * concentration


def _draw(rng: np.random.Generator, shape: tuple[int, int], effect: float, share: float,
          scores: Scores) -> tuple[FloatArray, NDArray[np.bool_]]:
    """One block of arrivals for every experiment: which arm each went to, and its score."""
    arm = rng.random(shape) < share
    values = np.empty(shape)
    for mask, mean in ((~arm, CONTROL_MEAN), (arm, CONTROL_MEAN + effect)):
        size = int(mask.sum())
        if scores == "beta":
            values[mask] = rng.beta(*_beta_parameters(mean, SCORE_SD), size)
        else:
            values[mask] = rng.random(size) < mean
    return values, arm


def simulate(n_experiments: int, max_per_arm: int, look_every: int, effect: float, *, alpha: float = 0.05,
             tau: float = 0.05, burn_in: int = 20, share: float = 0.5, seed: int = 0, scores: Scores = "beta",
             variance_floor: float = 1e-4) -> SimulationResult:
    """Run ``n_experiments`` experiments at once, each checked after every ``look_every`` arrivals
    with the same Lambda as ``sequential_test``, and count those that ever reach p <= alpha.

    Scores are Beta with mean 0.75 and sd 0.15 in the control arm and mean 0.75 + effect, same sd, in
    the candidate arm (``scores="bernoulli"``: 0/1 outcomes with those means). Each arrival goes to
    the candidate with probability ``share``. An experiment stops at max_per_arm / max(share,
    1 - share) arrivals, where the larger arm expects max_per_arm (2 * max_per_arm at share 0.5).
    """
    _check_parameters(alpha, tau, burn_in, variance_floor)
    if n_experiments < 1 or look_every < 1:
        raise ValueError(f"n_experiments and look_every must be >= 1; got {n_experiments} and {look_every}")
    if not 0.0 < share < 1.0:
        raise ValueError(f"share must be in (0, 1) for both arms to fill; got {share}")
    if max_per_arm < burn_in:
        raise ValueError(f"max_per_arm ({max_per_arm}) must be at least burn_in ({burn_in}), or no look happens")
    if scores not in SCORES:
        raise ValueError(f"scores must be one of {SCORES}; got {scores!r}")
    for mean in (CONTROL_MEAN, CONTROL_MEAN + effect):
        if scores == "beta":
            _beta_parameters(mean, SCORE_SD)
        elif not 0.0 <= mean <= 1.0:
            raise ValueError(f"a rate must be in [0, 1]: 0.75 + effect is {mean}")

    max_arrivals = math.ceil(max_per_arm / max(share, 1.0 - share))
    rng = np.random.default_rng(seed)
    count, total, total_sq = np.zeros((2, n_experiments)), np.zeros((2, n_experiments)), np.zeros((2, n_experiments))
    shift = np.zeros(n_experiments)
    found_at = np.zeros(n_experiments, dtype=np.int64)  # arrivals at the first rejection; 0 = none yet
    found_difference = np.zeros(n_experiments)
    arrivals = 0
    while arrivals < max_arrivals:
        size = min(look_every, max_arrivals - arrivals)
        values, arm = _draw(rng, (n_experiments, size), effect, share, scores)
        if arrivals == 0:
            shift = values[:, 0].copy()
        y = values - shift[:, None]
        for index, mask in enumerate((~arm, arm)):
            count[index] += mask.sum(axis=1)
            total[index] += np.where(mask, y, 0.0).sum(axis=1)
            total_sq[index] += np.where(mask, y * y, 0.0).sum(axis=1)
        arrivals += size
        live = np.flatnonzero((count >= burn_in).all(axis=0) & (found_at == 0))
        if live.size == 0:
            continue
        mean_a, var_a = _moments(count[0, live], total[0, live], total_sq[0, live], shift[live])
        mean_c, var_c = _moments(count[1, live], total[1, live], total_sq[1, live], shift[live])
        log_lambda = _log_lambda(count[0, live], mean_a, var_a, count[1, live], mean_c, var_c,
                                 tau=tau, variance_floor=variance_floor)
        now = _p_value(log_lambda) <= alpha
        found_at[live[now]] = arrivals
        found_difference[live[now]] = (mean_c - mean_a)[now]

    found = found_at > 0
    rejected = int(found.sum())
    direction = (None if effect == 0.0 or rejected == 0
                 else float((np.sign(found_difference[found]) == np.sign(effect)).mean()))
    return SimulationResult(effect, n_experiments, max_arrivals, look_every, rejected, rejected / n_experiments,
                            float(np.median(found_at[found])) if rejected else None, direction)
