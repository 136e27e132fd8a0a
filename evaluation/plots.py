"""The evaluation report's plots as PNG bytes (pure: data in, bytes out), drawn by matplotlib's Agg
renderer through ``Figure`` + ``FigureCanvasAgg`` rather than pyplot, so nothing here selects a backend
or registers figures for other code in the process. Output is deterministic for the same input and
matplotlib: fixed sizes, DPI and margins, and no "Software" text in the PNG. Each plot function returns
None when it has nothing to draw; :func:`report_plots` then says why instead of showing an empty picture."""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator
from numpy.typing import NDArray

from evaluation.compare import Comparison, MetricComparison, RunScores
from rag_service.domain.eval_runs import (
    IR_METRICS,
    LATENCY_METRIC,
    LOWER_IS_BETTER,
    RAGAS_OFFLINE_METRICS,
    REFERENCE_CORRECTNESS,
    SEVEN_METRICS,
    SQUAD_METRICS,
    EvalItemResult,
)

FloatArray = NDArray[np.float64]
DPI = 100
COLOURS = ("#4e79a7", "#e8853a")  # the baseline (A) blue, the reported run (B) orange; both named in a legend
BETTER, WORSE, NO_DIFFERENCE = "#2e7d32", "#c62828", "#616161"
# Ranks of the first relevant document, grouped so each bucket has items even on small runs; the last
# bucket holds items where no relevant document was retrieved.
RANK_BUCKETS = ((1, 1, "1"), (2, 2, "2"), (3, 3, "3"), (4, 5, "4-5"), (6, 10, "6-10"), (11, 20, "11-20"),
                (21, None, ">20"))
NOT_RETRIEVED = "not retrieved"
# Latency is drawn on a log axis when the slowest item took this many times the fastest: two decades
# on a linear axis squeeze most items into the first bar.
LOG_SPREAD = 100.0
METRIC_ORDER = (IR_METRICS + SQUAD_METRICS + (REFERENCE_CORRECTNESS,) + RAGAS_OFFLINE_METRICS + SEVEN_METRICS
                + (LATENCY_METRIC, "cost_usd"))


@dataclass(frozen=True)
class Png:
    data: bytes
    width: int  # pixels
    height: int
    description: str  # what is drawn, for the alt text


@dataclass(frozen=True)
class Series:
    label: str  # the run's label in the legend
    values: FloatArray  # finite values, one per item


def _plain(text: str) -> str:
    """Text from the runs (names, metric names) as matplotlib draws it literally: a "$" would start
    mathtext, and an unbalanced one fails the whole figure."""
    return text.replace("$", r"\$")


def _figure(width: float, height: float) -> Figure:
    figure = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(figure)  # Agg for this figure only
    return figure


def _margins(figure: Figure, *, left: float, right: float, bottom: float, top: float, **spacing: float) -> None:
    """Margins in inches, set by hand: a layout engine (constrained, tight) measures every text
    repeatedly and doubles the time a report takes, while these figures have fixed sizes and short labels."""
    width, height = figure.get_size_inches()
    figure.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height,
                           **spacing)


def _png(figure: Figure, description: str) -> Png:
    buffer = io.BytesIO()
    # No "Software" (matplotlib version) chunk: the bytes depend only on the data and the drawing code.
    figure.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    width, height = (round(size * DPI) for size in figure.get_size_inches())
    figure.clear()  # not registered with pyplot, so this releases the artists now rather than at collection
    return Png(buffer.getvalue(), width, height, description)


def metric_order(names: Iterable[str]) -> list[str]:
    """The domain's known metrics in their order, then any others by name."""
    names = set(names)
    known = [name for name in METRIC_ORDER if name in names]
    return known + sorted(names - set(known))


def is_unit_scale(metric: str, values: FloatArray) -> bool:
    """A score in [0, 1] (every metric but timings and costs, per the domain): such metrics share bins
    and an axis. A cost of a few cents also lies in [0, 1], hence the name as well as the values."""
    if metric in LOWER_IS_BETTER or metric.endswith(("_ms", "_usd")):
        return False
    return bool(values.size) and float(values.min()) >= 0.0 and float(values.max()) <= 1.0


def distributions(metrics: Mapping[str, Sequence[Series]]) -> Png | None:
    """One small histogram per metric (share of items per bin, so runs of different sizes compare);
    metrics without any value are left out. Unit-scale metrics share the bins 0, 0.05, .., 1."""
    drawn = {name: [s for s in series if s.values.size] for name, series in metrics.items()}
    drawn = {name: series for name, series in drawn.items() if series}
    if not drawn:
        return None
    columns = min(4, len(drawn))
    rows = -(-len(drawn) // columns)
    runs = max(drawn.values(), key=len)
    # A run keeps its colour in every panel, also one it alone has a value for.
    labels = list(dict.fromkeys(one.label for series in metrics.values() for one in series))
    colour_of = {label: COLOURS[i % len(COLOURS)] for i, label in enumerate(labels)}
    legend = 0.3 if len(runs) > 1 else 0.0
    figure = _figure(2.6 * columns, 0.6 + legend + 1.9 * rows)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    _margins(figure, left=0.55, right=0.15, bottom=0.3, top=0.3 + legend, wspace=0.45, hspace=0.55)
    for ax, (name, series) in zip(axes, drawn.items(), strict=False):
        pooled = np.concatenate([s.values for s in series])
        bins = np.linspace(0.0, 1.0, 21) if is_unit_scale(name, pooled) else np.histogram_bin_edges(pooled, bins=20)
        for one in series:
            ax.hist(one.values, bins=bins, weights=np.full(one.values.size, 1.0 / one.values.size),
                    histtype="step" if len(series) > 1 else "stepfilled", color=colour_of[one.label], linewidth=1.4,
                    alpha=1.0 if len(series) > 1 else 0.8, label=f"{one.label} (n={one.values.size})")
        only = f"{series[0].label} only, " if len(series) < len(runs) else ""  # a metric one run lacks
        ax.set_title(_plain(name if len(series) > 1 else f"{name} ({only}n={series[0].values.size})"), fontsize=9)
        ax.tick_params(labelsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(5))  # costs have long tick labels; five keep them apart
        ax.set_ylabel("share of items", fontsize=7)
    for ax in axes[len(drawn):]:
        ax.set_axis_off()
    if len(runs) > 1:
        handles = [Line2D([], [], color=c, label=_plain(s.label)) for c, s in zip(COLOURS, runs, strict=False)]
        figure.legend(handles=handles, loc="upper center", ncols=len(runs), fontsize=8, frameon=False)
    return _png(figure, "Histograms of " + ", ".join(drawn))


def differences(metrics: Sequence[MetricComparison], confidence: float) -> Png | None:
    """Mean difference B - A per metric with its bootstrap CI as a horizontal error bar; significant
    ones (Holm) are filled and coloured by direction. Unit-scale metrics share one axis; any other
    (latency, cost) gets its own, since its differences are in other units."""
    by_name = {m.metric: m for m in metrics
               if m.difference is not None and m.ci_low is not None and m.ci_high is not None}
    tested = [by_name[name] for name in metric_order(by_name)]
    if not tested:
        return None
    unit = [m for m in tested if is_unit_scale(m.metric, np.array([m.mean_a, m.mean_b], dtype=float))]
    groups = ([unit] if unit else []) + [[m] for m in tested if m not in unit]
    height, gap, bottom, top = 1.1 + 0.3 * len(tested) + 0.55 * len(groups), 0.45, 0.5, 0.4  # inches
    figure = _figure(7.5, height)
    axes = figure.subplots(len(groups), 1, squeeze=False, height_ratios=[len(g) + 1.2 for g in groups])[:, 0]
    widest = max(len(m.metric) + 2 for m in tested)  # characters of the longest y label, at 8 pt ~0.07 in each
    panel = (height - bottom - top - gap * (len(groups) - 1)) / len(groups)  # hspace is a share of the mean panel
    _margins(figure, left=0.3 + 0.07 * widest, right=0.25, bottom=bottom, top=top, hspace=gap / panel)
    for ax, group in zip(axes, groups, strict=True):
        for row, m in enumerate(reversed(group)):
            colour = {"better": BETTER, "worse": WORSE}.get(m.direction, NO_DIFFERENCE)
            ax.errorbar(m.difference, row, xerr=[[m.difference - m.ci_low], [m.ci_high - m.difference]],
                        fmt="D" if m.significant else "o", color=colour, markersize=6, capsize=3,
                        markerfacecolor=colour if m.significant else "white")
        ax.axvline(0.0, color="#999999", linewidth=0.8, zorder=0)
        ax.set_yticks(range(len(group)), [_plain(m.metric) + (" *" if m.significant else "") for m in reversed(group)],
                      fontsize=8)
        ax.set_ylim(-0.7, len(group) - 0.3)
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(axis="x", color="#eeeeee")
    axes[-1].set_xlabel(f"B - A: mean difference with its {confidence:.0%} bootstrap interval", fontsize=8)
    figure.legend(handles=[
        Line2D([], [], color=BETTER, marker="D", linestyle="", label="B significantly better"),
        Line2D([], [], color=WORSE, marker="D", linestyle="", label="B significantly worse"),
        Line2D([], [], color=NO_DIFFERENCE, marker="o", markerfacecolor="white", linestyle="",
               label="no significant difference")], loc="upper center", ncols=3, fontsize=8, frameon=False)
    significant = [m.metric for m in tested if m.significant]
    return _png(figure, "Mean differences B - A with confidence intervals for " + ", ".join(m.metric for m in tested)
                + (f"; significant: {', '.join(significant)}" if significant else "; none significant"))


def latency(series: Sequence[Series]) -> Png | None:
    """Histogram of each item's total latency, on a log axis when the spread is wide; a dashed line at
    each run's median."""
    series = [s for s in series if s.values.size]
    if not series:
        return None
    pooled = np.concatenate([s.values for s in series])
    positive = pooled[pooled > 0]
    log = positive.size == pooled.size and float(positive.max()) >= LOG_SPREAD * float(positive.min())
    bins = np.geomspace(positive.min(), positive.max(), 31) if log else np.histogram_bin_edges(pooled, bins=30)
    figure = _figure(7.5, 3.0)
    ax = figure.subplots()
    _margins(figure, left=0.6, right=0.2, bottom=0.5, top=0.15)
    legend = []
    for colour, one in zip(COLOURS, series, strict=False):
        median = float(np.median(one.values))
        ax.hist(one.values, bins=bins, histtype="step" if len(series) > 1 else "stepfilled", color=colour,
                alpha=1.0 if len(series) > 1 else 0.8, linewidth=1.4)
        ax.axvline(median, color=colour, linestyle="--", linewidth=1)
        # Explicit handles: an automatic legend would drop a run whose name starts with "_".
        legend.append(Line2D([], [], color=colour, label=_plain(f"{one.label} (n={one.values.size}, "
                                                                f"median {median:.0f} ms)")))
    if log:
        ax.set_xscale("log")
    ax.set_xlabel("total latency per item, ms" + (" (log scale)" if log else ""), fontsize=8)
    ax.set_ylabel("item runs", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(handles=legend, fontsize=8, frameon=False)
    return _png(figure, "Histogram of total latency per item" + (" on a log scale" if log else ""))


def rank_bucket(rank: int | None) -> str:
    if rank is None:
        return NOT_RETRIEVED
    for low, high, label in RANK_BUCKETS:
        if rank >= low and (high is None or rank <= high):
            return label
    return RANK_BUCKETS[0][2]  # ranks start at 1; a 0 from a buggy runner is shown with rank 1


def score_by_rank(ranks: Sequence[int | None], scores: FloatArray, metric: str) -> Png | None:
    """Box plot of the answer score per bucket of the first relevant document's rank (means marked),
    with a bucket for items where none was retrieved. None when no item has a relevant rank: one
    "not retrieved" box says nothing about rank (e.g. QA datasets, which have no relevance labels)."""
    if not any(rank is not None for rank in ranks):
        return None
    labels = [label for _, _, label in RANK_BUCKETS] + [NOT_RETRIEVED]
    by_bucket: dict[str, list[float]] = {label: [] for label in labels}
    for rank, score in zip(ranks, scores, strict=True):
        by_bucket[rank_bucket(rank)].append(float(score))
    shown = [label for label in labels if by_bucket[label]]
    figure = _figure(7.5, 3.2)
    ax = figure.subplots()
    _margins(figure, left=0.6, right=0.2, bottom=0.7, top=0.15)
    ax.boxplot([by_bucket[label] for label in shown], positions=range(len(shown)), widths=0.6, showmeans=True,
               showfliers=False, patch_artist=True, boxprops={"facecolor": "#dbe5f1"},
               medianprops={"color": COLOURS[1]},
               meanprops={"marker": "D", "markerfacecolor": COLOURS[0], "markeredgecolor": COLOURS[0]})
    ax.set_xticks(range(len(shown)), [f"{label}\nn={len(by_bucket[label])}" for label in shown], fontsize=7)
    ax.set_xlabel("rank of the first relevant document", fontsize=8)
    ax.set_ylabel(_plain(metric), fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(axis="y", color="#eeeeee")
    return _png(figure, f"Box plots of {metric} by rank of the first relevant document ({', '.join(shown)})")


# --- the report's plots, with their captions or why each is left out -------------------------------------

SCORE_METRICS = ("overall", "squad_f1", "ndcg@10")  # the answer score plotted against retrieval rank, first present


@dataclass(frozen=True)
class Plot:
    key: str  # the Markdown asset's file stem
    title: str
    png: Png | None
    text: str  # the caption; when png is None, why the plot is left out


@dataclass(frozen=True)
class RunData:
    label: str
    results: Sequence[EvalItemResult]
    scores: RunScores  # metric -> item id -> value, repetitions averaged (evaluation.summary.run_scores)


def report_plots(runs: Sequence[RunData], metrics: Sequence[str], comparison: Comparison | None) -> list[Plot]:
    """The report's plots for one run, or a baseline and the run (in that order): distributions of
    ``metrics`` over items, mean differences (only with a comparison), latency, and the last run's score
    by retrieval rank."""
    found: list[Plot] = []
    per_metric = {name: [Series(run.label, np.array([v for v in run.scores.get(name, {}).values() if v is not None],
                                                    dtype=float)) for run in runs] for name in metrics}
    png = distributions(per_metric)
    found.append(Plot("distributions", "Metric distributions", png, (
        "Each metric's values over items (repetitions averaged), as a share of the items scored; metrics never "
        "scored are left out." if png else "No metric has a value: the distribution plot is left out.")))
    if comparison is not None:
        png = differences(comparison.metrics, comparison.confidence)
        found.append(Plot("differences", "Mean differences B - A", png, (
            f"Per metric the mean paired difference B - A with its {comparison.confidence:.0%} percentile-bootstrap "
            "interval; filled, coloured and starred: significant after Holm's correction." if png else
            "The runs have no metric scored on the same items: the difference plot is left out.")))
    # Failed item runs are left out, as from the metric table's latency_ms (evaluation.summary.run_scores).
    totals = [Series(run.label, np.array([t for r in run.results if r.error is None and (t := r.latency_ms.get("total"))
                                          is not None and math.isfinite(t)], dtype=float)) for run in runs]
    png = latency(totals)
    quantiles = "; ".join(f"{s.label}: p50 {p50:.0f} ms, p95 {p95:.0f} ms, p99 {p99:.0f} ms" for s in totals
                          if s.values.size for p50, p95, p99 in [np.percentile(s.values, [50, 95, 99])])
    found.append(Plot("latency", "Latency", png, (
        f"Total latency of each item run that did not fail (latency_ms['total']). {quantiles}." if png else
        "No item recorded a total latency (latency_ms['total']): the latency plot is left out.")))

    run = runs[-1]
    metric = next((m for m in SCORE_METRICS if any(r.metrics.get(m) is not None for r in run.results)), None)
    if metric is None:
        found.append(Plot("score_by_rank", "Score by retrieval rank", None,
                          f"None of {', '.join(SCORE_METRICS)} has a value: the score-by-rank plot is left out."))
        return found
    scored = [r for r in run.results if r.metrics.get(metric) is not None]
    png = score_by_rank([r.relevant_rank for r in scored], np.array([r.metrics[metric] for r in scored]), metric)
    found.append(Plot("score_by_rank", "Score by retrieval rank", png, (
        f"{metric} of each item run of {run.label} by the rank of the first relevant document retrieved (box: "
        "quartiles, line: median, diamond: mean); 'not retrieved': none of the documents retrieved was relevant."
        if png else "No scored item has a rank for a relevant document (no relevance labels, or none retrieved): "
        "the score-by-rank plot is left out.")))
    return found
