"""Paired comparison of two evaluation runs on the same items (pure, numpy); the promotion gate on
its result is ``gate.py``.

Run A is the baseline (production), run B the candidate; every difference is B - A. A run is given
as ``metric -> item id -> value`` (:data:`RunScores`); a value of None means the item was not scored
on that metric, and a metric counts only the items with a value in both runs (the rest are counted
as ``missing_in_a`` / ``missing_in_b``). Items are the experimental unit: the two runs answered the
same queries, so the per-item differences carry the comparison and the item-to-item spread of
difficulty, which is most of the variance, cancels.

Per metric:

- **Confidence interval**: the percentile bootstrap of the mean paired difference (Efron &
  Tibshirani 1993, "An Introduction to the Bootstrap", Chapman & Hall, ch. 13): resample items with
  replacement, take the mean difference of each resample, read the (1 - c)/2 and (1 + c)/2 quantiles.
- **p-value**: Fisher's paired randomisation (sign-flip) test of "mean difference = 0" (Fisher
  1935, "The Design of Experiments", section 21): under the null each pair's two values are
  exchangeable, so each difference's sign is a fair coin; the p-value is the share of random sign
  assignments whose |sum| reaches the observed one, (count + 1) / (resamples + 1) so that it is never
  0 (Phipson & Smyth 2010, "Permutation P-values Should Never Be Zero", SAGAP 9(1)). When
  2^n <= resamples every assignment is enumerated and p is exact (as scipy.stats.permutation_test).
  Two-sided.
- **Multiplicity**: Holm's step-down adjustment across the metrics of the comparison (Holm 1979,
  "A Simple Sequentially Rejective Multiple Test Procedure", Scand. J. Statist. 6(2)): it keeps the
  family-wise error rate at alpha = 1 - confidence under any dependence between metrics, which
  matters because nDCG, MRR and recall move together. A metric is significant when its adjusted
  p <= alpha. The confidence intervals are per metric, not simultaneous: a CI can exclude 0 while the
  Holm-adjusted p is above alpha.

Speed: all metrics share one resample of the items and one set of sign flips, computed in chunks as
a matrix product (resample counts x item differences), so 10,000 items x 10,000 resamples costs
about a second whatever the number of metrics (benchmarks/eval_compare_speed.py). A metric whose
items are a subset of all items is averaged over the resampled items that have it: conditional on
how many of its items a resample drew, that is the ordinary bootstrap of that metric, and one shared
resample keeps the cost independent of how missing values are spread over metrics (a metric with so
few items that some resample draws none of them falls back to the ordinary bootstrap over its own
items). A metric present on every item gets exactly the ordinary bootstrap: the same numbers as
:func:`paired_bootstrap_ci` on its differences in item-id order with the same seed.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import BaseModel, ConfigDict

from rag_service.errors import InvalidInputError

RunScores = Mapping[str, Mapping[str, float | None]]  # metric -> item id -> value (None: not scored)
Direction = Literal["better", "worse", "no difference"]
FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]

# Cells (resamples x items) per chunk: 512K keeps the index, count and bit matrices at a few MB whatever
# the run size (10,000 x 10,000 at once would take 800 MB of counts); from 64K to 2M cells the time
# hardly changes (measured with benchmarks/eval_compare_speed.py), so the chunk stays small.
_CHUNK_CELLS = 1 << 19
# A sign-flipped sum counts as reaching the observed one within this share of sum(|d|): the sums are
# computed two ways (observed directly, flipped through a matrix product), and discrete metrics
# (exact match, recall over few documents) make exact ties common; rounding must not break them.
_TIE_TOLERANCE = 1e-9


# The metric a reader looks at first: an answer run's overall grade, a retrieval run's nDCG@10.
HEADLINE_METRICS = ("overall", "ndcg@10", "squad_f1")


def _headline(metrics: Sequence[str], lower_is_better: Collection[str]) -> str | None:
    preferred = [m for m in HEADLINE_METRICS if m in metrics] + [m for m in metrics if m not in lower_is_better]
    return (preferred or list(metrics) or [None])[0]


class DatasetMismatchError(InvalidInputError, ValueError):
    """The two runs were made on different dataset versions, and comparing them was not allowed."""

    status_code = 409  # the request is well formed; the two runs it names conflict
    exit_code = 6  # as ConflictError's


class MetricComparison(BaseModel):
    model_config = ConfigDict(frozen=True)

    metric: str
    higher_is_better: bool
    n: int  # items with a value in both runs
    missing_in_a: int  # items with a value in run B only: dropped
    missing_in_b: int  # items with a value in run A only: dropped
    mean_a: float | None  # over the n paired items; None when n == 0
    mean_b: float | None
    difference: float | None  # mean of (B - A) over the n paired items
    ci_low: float | None  # percentile bootstrap CI of the difference, at the comparison's confidence
    ci_high: float | None
    p_value: float | None  # paired randomisation test, before the Holm adjustment
    p_holm: float | None
    significant: bool  # p_holm <= 1 - confidence
    direction: Direction  # of B against A; "no difference" unless significant


class WorseItem(BaseModel):
    model_config = ConfigDict(frozen=True)

    item_id: str
    regression: float  # how much worse B is than A on the comparison's worst_by metric (> 0)
    values_a: dict[str, float | None]  # every compared metric; None: not scored in that run
    values_b: dict[str, float | None]


class Comparison(BaseModel):
    model_config = ConfigDict(frozen=True)

    metrics: tuple[MetricComparison, ...]  # in run A's metric order
    worst_items: tuple[WorseItem, ...]  # the items that got worse most on worst_by, worst first
    worst_by: str | None  # None when no metric is shared by both runs
    metrics_only_in_a: tuple[str, ...]  # not compared
    metrics_only_in_b: tuple[str, ...]
    confidence: float
    resamples: int
    seed: int
    dataset_a: str | None
    dataset_b: str | None

    def metric(self, name: str) -> MetricComparison:
        for result in self.metrics:
            if result.metric == name:
                return result
        raise KeyError(f"metric {name!r} is not in this comparison; compared: {[m.metric for m in self.metrics]}")


# --- the statistics, on matrices of per-item differences (items x metrics) ---------------------------

def _generators(seed: int) -> tuple[np.random.Generator, np.random.Generator]:
    """Independent streams for the bootstrap and the randomisation test, the same for a seed whether
    one metric is tested or many, so compare() reproduces the single-metric functions."""
    bootstrap, randomisation = np.random.SeedSequence(seed).spawn(2)
    return np.random.default_rng(bootstrap), np.random.default_rng(randomisation)


def _chunks(total: int, items: int) -> list[tuple[int, int]]:
    rows = max(1, _CHUNK_CELLS // max(items, 1))
    return [(start, min(rows, total - start)) for start in range(0, total, rows)]


def bootstrap_means(differences: FloatArray, present: BoolArray, *, resamples: int,
                     rng: np.random.Generator) -> FloatArray:
    """Resampled mean differences, shape (resamples, metrics); NaN where a resample drew none of a
    metric's items. ``differences`` is 0 where ``present`` is False.

    A resample is a vector of counts (how often each item was drawn); its mean for a metric is
    counts @ differences / counts @ present, so every metric shares the draw and the work is a matrix
    product. Counts come from bincount over row-offset indices: one vectorised pass per chunk (drawn as
    intp, the type bincount works in, which saves it a conversion pass)."""
    items, metrics = differences.shape
    means = np.empty((resamples, metrics))
    complete = bool(present.all())
    weights = present.astype(np.float64)
    for start, rows in _chunks(resamples, items):
        draws = rng.integers(0, items, size=(rows, items), dtype=np.intp)
        draws += (np.arange(rows, dtype=np.intp) * items)[:, None]  # row r counts into cells r*items..
        counts = np.bincount(draws.ravel(), minlength=rows * items).reshape(rows, items)
        totals = counts @ differences
        if complete:
            means[start:start + rows] = totals / items
        else:
            drawn = counts @ weights
            with np.errstate(invalid="ignore", divide="ignore"):
                means[start:start + rows] = np.where(drawn > 0, totals / drawn, np.nan)
    return means


def percentile_interval(means: FloatArray, confidence: float) -> tuple[FloatArray, FloatArray]:
    # Linear interpolation between order statistics, as scipy.stats.bootstrap(method="percentile").
    tail = (1.0 - confidence) / 2.0
    low, high = np.nanquantile(means, [tail, 1.0 - tail], axis=0)
    return low, high


def _sign_flip_counts(differences: FloatArray, *, resamples: int, rng: np.random.Generator) -> NDArray[np.int64]:
    """Per metric, how many random sign assignments give |sum(s * d)| >= |sum(d)|.

    With bits b in {0, 1} and signs s = 2b - 1, sum(s * d) = 2 (b @ d) - sum(d): one product per
    chunk serves every metric. Items a metric lacks have d = 0, so their signs do not matter and the
    test of each metric is exactly the test over its own items."""
    items = differences.shape[0]
    total = differences.sum(axis=0)
    threshold = np.abs(total) - _TIE_TOLERANCE * np.abs(differences).sum(axis=0)
    reached = np.zeros(differences.shape[1], dtype=np.int64)
    for _, rows in _chunks(resamples, items):
        random_bytes = rng.integers(0, 256, size=(rows, (items + 7) // 8), dtype=np.uint8)
        bits = np.unpackbits(random_bytes, axis=1, count=items)
        flipped = 2.0 * (bits @ differences) - total
        reached += (np.abs(flipped) >= threshold).sum(axis=0)
    return reached


def _exact_sign_flip_p(differences: FloatArray) -> float:
    """Every one of the 2^n sign assignments: the exact randomisation p-value (it counts the observed
    assignment itself, so it is at least 2 / 2^n, never 0)."""
    n = differences.size
    bits = (np.arange(2**n)[:, None] >> np.arange(n)) & 1
    total = differences.sum()
    flipped = 2.0 * (bits @ differences) - total
    threshold = abs(total) - _TIE_TOLERANCE * np.abs(differences).sum()
    return float(np.count_nonzero(np.abs(flipped) >= threshold) / 2**n)


def _is_exact(n: int, resamples: int) -> bool:
    return n < 63 and 2**n <= resamples


def _check_parameters(confidence: float, resamples: int) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), e.g. 0.95; got {confidence}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, e.g. 10_000; got {resamples}")


def _as_differences(differences: ArrayLike) -> FloatArray:
    values = np.asarray(differences, dtype=np.float64)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"differences must be a non-empty 1-D array of paired differences; got shape {values.shape}")
    if not np.isfinite(values).all():
        raise ValueError("differences must be finite; drop unscored items (None) before testing")
    return values


def paired_bootstrap_ci(differences: ArrayLike, *, confidence: float = 0.95, resamples: int = 10_000,
                        seed: int = 0) -> tuple[float, float]:
    """The percentile bootstrap confidence interval of the mean of paired differences (B - A per
    item), Efron & Tibshirani (1993) ch. 13. Deterministic for a seed."""
    _check_parameters(confidence, resamples)
    values = _as_differences(differences)[:, None]
    bootstrap_rng, _ = _generators(seed)
    means = bootstrap_means(values, np.ones_like(values, dtype=bool), resamples=resamples, rng=bootstrap_rng)
    low, high = percentile_interval(means, confidence)
    return float(low[0]), float(high[0])


def paired_randomisation_p(differences: ArrayLike, *, resamples: int = 10_000, seed: int = 0) -> float:
    """Two-sided p-value of Fisher's paired randomisation (sign-flip) test of mean difference = 0:
    exact when 2^n <= resamples, else Monte Carlo with (count + 1) / (resamples + 1)."""
    _check_parameters(0.95, resamples)
    values = _as_differences(differences)
    if _is_exact(values.size, resamples):
        return _exact_sign_flip_p(values)
    _, randomisation_rng = _generators(seed)
    reached = _sign_flip_counts(values[:, None], resamples=resamples, rng=randomisation_rng)
    return float((reached[0] + 1) / (resamples + 1))


def holm(p_values: ArrayLike) -> FloatArray:
    """Holm (1979) step-down adjusted p-values, in the input order: the i-th smallest p times
    (m - i + 1), made non-decreasing in that order, capped at 1. Reject where adjusted <= alpha."""
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1 or ((p < 0) | (p > 1)).any() or np.isnan(p).any():
        raise ValueError(f"p_values must be a 1-D array of probabilities in [0, 1]; got {p_values!r}")
    order = np.argsort(p, kind="stable")
    scaled = (p.size - np.arange(p.size)) * p[order]
    adjusted = np.empty_like(p)
    adjusted[order] = np.minimum(1.0, np.maximum.accumulate(scaled))
    return adjusted


def _intervals_and_p_values(differences: FloatArray, present: BoolArray, *, confidence: float, resamples: int,
                            seed: int) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Per metric (column, each with at least one item): the bootstrap CI ends and the raw p-value."""
    bootstrap_rng, randomisation_rng = _generators(seed)
    means = bootstrap_means(differences, present, resamples=resamples, rng=bootstrap_rng)
    for column in np.flatnonzero(np.isnan(means).any(axis=0)):
        # Some resample drew none of this metric's few items (likely only when it has fewer than ~15):
        # fall back to the ordinary bootstrap over its own items.
        own = differences[present[:, column], column][:, None]
        means[:, column] = bootstrap_means(own, np.ones_like(own, dtype=bool), resamples=resamples,
                                            rng=_generators(seed)[0])[:, 0]
    ci_low, ci_high = percentile_interval(means, confidence)
    p_values = (_sign_flip_counts(differences, resamples=resamples, rng=randomisation_rng) + 1) / (resamples + 1)
    for column, n in enumerate(present.sum(axis=0)):
        if _is_exact(int(n), resamples):
            p_values[column] = _exact_sign_flip_p(differences[present[:, column], column])
    return ci_low, ci_high, p_values


# --- compare ------------------------------------------------------------------------------------------

def _scored(run: RunScores, metric: str, run_name: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for item_id, value in run[metric].items():
        if value is None:
            continue
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"run {run_name}, metric {metric!r}, item {item_id!r}: value {value!r} is not finite; "
                             "use None for an item that could not be scored")
        values[item_id] = number
    return values


def _direction(significant: bool, difference: float | None, higher_is_better: bool) -> Direction:
    if not significant or difference is None or difference == 0.0:
        return "no difference"
    return "better" if (difference > 0) == higher_is_better else "worse"


def _worst_items(by: str, scored_a: Mapping[str, dict[str, float]], scored_b: Mapping[str, dict[str, float]],
                 higher_is_better: bool, count: int) -> tuple[WorseItem, ...]:
    a, b = scored_a[by], scored_b[by]
    ids = sorted(a.keys() & b.keys())
    if count == 0 or not ids:
        return ()
    change = np.array([b[i] - a[i] for i in ids])
    regression = -change if higher_is_better else change
    # Largest regression first; equal regressions in item-id order, so the list is reproducible.
    order = [k for k in np.lexsort((np.arange(len(ids)), -regression)) if regression[k] > 0][:count]
    return tuple(WorseItem(item_id=ids[k], regression=float(regression[k]),
                           values_a={m: scored_a[m].get(ids[k]) for m in scored_a},
                           values_b={m: scored_b[m].get(ids[k]) for m in scored_b}) for k in order)


def compare(run_a: RunScores, run_b: RunScores, *, lower_is_better: frozenset[str] | set[str] = frozenset(),
            confidence: float = 0.95, resamples: int = 10_000, seed: int = 0, worst: int = 10,
            worst_by: str | None = None, dataset_a: str | None = None, dataset_b: str | None = None,
            allow_different_datasets: bool = False) -> Comparison:
    """Compare run B (candidate) against run A (baseline) on every metric both runs have.

    ``lower_is_better`` names metrics where a decrease is an improvement (latency_ms, cost); names
    not in the runs are ignored, so one set can serve every comparison. ``worst`` items that got
    worse most are listed by ``worst_by`` (default: the first of ``HEADLINE_METRICS`` both runs have,
    else their first shared quality metric). ``dataset_a`` and
    ``dataset_b`` are the runs' dataset versions (content hashes); when both are known and differ,
    :class:`DatasetMismatchError` is raised unless ``allow_different_datasets``."""
    _check_parameters(confidence, resamples)
    if worst < 0:
        raise ValueError(f"worst is a number of items and must be >= 0; got {worst}")
    if dataset_a is not None and dataset_b is not None and dataset_a != dataset_b and not allow_different_datasets:
        raise DatasetMismatchError(
            f"run A was made on dataset version {dataset_a} and run B on {dataset_b}: their items differ, so a "
            "paired comparison would be misleading; allow different datasets to compare them anyway",
            stage="eval compare")
    metrics = [m for m in run_a if m in run_b]
    if worst_by is not None and worst_by not in metrics:
        raise ValueError(f"worst_by {worst_by!r} is not a metric of both runs; shared metrics: {metrics}")
    scored_a = {m: _scored(run_a, m, "A") for m in metrics}
    scored_b = {m: _scored(run_b, m, "B") for m in metrics}
    paired_ids = [sorted(scored_a[m].keys() & scored_b[m].keys()) for m in metrics]
    # Sorted ids: the result does not depend on the order the runner stored the items in.
    universe = sorted(set().union(*paired_ids)) if paired_ids else []
    row = {item_id: k for k, item_id in enumerate(universe)}
    differences = np.zeros((len(universe), len(metrics)))
    present = np.zeros((len(universe), len(metrics)), dtype=bool)
    for column, (metric, ids) in enumerate(zip(metrics, paired_ids, strict=True)):
        rows = np.fromiter((row[i] for i in ids), dtype=np.intp, count=len(ids))
        a, b = scored_a[metric], scored_b[metric]
        differences[rows, column] = [b[i] - a[i] for i in ids]
        present[rows, column] = True

    n = present.sum(axis=0)
    tested = n > 0
    alpha = 1.0 - confidence
    if tested.sum() / (resamples + 1) > alpha:
        # A Monte Carlo p is at least 1 / (resamples + 1), and Holm multiplies the smallest by the number
        # of metrics: below this many resamples no difference, however large, could be significant.
        needed = math.ceil(tested.sum() / alpha) - 1
        raise ValueError(f"{resamples} resamples cannot show a significant difference on {int(tested.sum())} metrics "
                         f"at alpha {alpha:g} after Holm's correction; use at least {needed}, e.g. 10_000")
    ci_low, ci_high, p_raw = (np.full(len(metrics), np.nan) for _ in range(3))
    if tested.any():
        ci_low[tested], ci_high[tested], p_raw[tested] = _intervals_and_p_values(
            differences[:, tested], present[:, tested], confidence=confidence, resamples=resamples, seed=seed)
    p_holm = np.full(len(metrics), np.nan)
    p_holm[tested] = holm(p_raw[tested])

    results = []
    for column, (metric, ids) in enumerate(zip(metrics, paired_ids, strict=True)):
        a, b = scored_a[metric], scored_b[metric]
        count = int(n[column])
        higher_is_better = metric not in lower_is_better
        mean_a = float(np.mean([a[i] for i in ids])) if count else None
        mean_b = float(np.mean([b[i] for i in ids])) if count else None
        difference = float(differences[present[:, column], column].mean()) if count else None
        significant = bool(tested[column] and p_holm[column] <= alpha)
        results.append(MetricComparison(
            metric=metric, higher_is_better=higher_is_better, n=count,
            missing_in_a=len(b.keys() - a.keys()), missing_in_b=len(a.keys() - b.keys()),
            mean_a=mean_a, mean_b=mean_b, difference=difference,
            ci_low=float(ci_low[column]) if count else None, ci_high=float(ci_high[column]) if count else None,
            p_value=float(p_raw[column]) if count else None, p_holm=float(p_holm[column]) if count else None,
            significant=significant, direction=_direction(significant, difference, higher_is_better)))

    by = worst_by if worst_by is not None else _headline(metrics, lower_is_better)
    worst_items = () if by is None else _worst_items(by, scored_a, scored_b, by not in lower_is_better, worst)
    return Comparison(metrics=tuple(results), worst_items=worst_items, worst_by=by,
                      metrics_only_in_a=tuple(m for m in run_a if m not in run_b),
                      metrics_only_in_b=tuple(m for m in run_b if m not in run_a),
                      confidence=confidence, resamples=resamples, seed=seed, dataset_a=dataset_a, dataset_b=dataset_b)
