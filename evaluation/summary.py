"""A run's results as numbers: per-metric means for its record, and per-item scores for a paired
comparison (repetitions of an item averaged, so the item stays the unit that is paired)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from evaluation.compare import RunScores
from rag_service.domain import LATENCY_METRIC, EvalItemResult, ScoreRow


def score_row(result: EvalItemResult) -> ScoreRow:
    return ScoreRow(result.item_id, result.metrics, result.latency_ms.get("total"), result.cost_usd,
                    result.error is not None)


def item_values(row: ScoreRow) -> dict[str, float]:
    """Every number of an item that a comparison can pair: its metrics, total latency and cost."""
    values = {name: float(value) for name, value in row.metrics.items() if value is not None}
    if row.latency_total_ms is not None:
        values[LATENCY_METRIC] = float(row.latency_total_ms)
    if row.cost_usd is not None:
        values["cost_usd"] = float(row.cost_usd)
    return values


def run_scores(results: Iterable[EvalItemResult | ScoreRow]) -> RunScores:
    """metric -> item id -> mean over the item's repetitions. Failed items are left out: an error is
    not a score of 0 on every metric (it is counted in the run's summary instead)."""
    sums: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for one in results:
        row = one if isinstance(one, ScoreRow) else score_row(one)
        if row.failed:
            continue
        for name, value in item_values(row).items():
            sums[name][row.item_id].append(value)
    # sum/len, not np.mean: a numpy call per item costs ~10x more on runs of 10,000 items.
    return {name: {item: sum(values) / len(values) for item, values in by_item.items()}
            for name, by_item in sums.items()}


def summarise(results: Sequence[EvalItemResult]) -> dict[str, Any]:
    scores = run_scores(results)
    metrics = {name: {"mean": round(float(np.mean(list(by_item.values()))), 4), "n": len(by_item)}
               for name, by_item in scores.items() if by_item}
    # A metric every item left unscored (consistency of one-sentence answers) is shown as such, not
    # dropped: a reader looking for it learns it was measured and had nothing to grade.
    for result in results:
        for name in result.metrics:
            metrics.setdefault(name, {"mean": None, "n": 0})
    totals = [r.latency_ms["total"] for r in results if r.error is None and "total" in r.latency_ms]
    outcomes: dict[str, int] = defaultdict(int)
    for result in results:
        if result.outcome is not None:
            outcomes[result.outcome] += 1
    summary: dict[str, Any] = {"results": len(results), "failed": sum(r.error is not None for r in results),
                               "metrics": metrics}
    if totals:
        summary["latency_ms"] = {"p50": round(float(np.percentile(totals, 50)), 2),
                                 "p95": round(float(np.percentile(totals, 95)), 2)}
    if outcomes:
        summary["outcomes"] = dict(outcomes)
    return summary
