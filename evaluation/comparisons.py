"""Two stored runs compared item by item (``compare.py`` does the statistics): what ``ragsvc eval
compare``, ``GET /v1/eval-runs/{id}/compare``, the reports and the promotion gate share."""

from __future__ import annotations

import time
from dataclasses import dataclass

from evaluation.compare import Comparison, compare
from evaluation.summary import run_scores
from rag_service.db.repos.eval_runs import EvalRunRepository
from rag_service.domain import LOWER_IS_BETTER, EvalItemResult, EvalRun, TenantScope
from rag_service.errors import ConflictError


@dataclass(frozen=True)
class RunComparison:
    run_a: EvalRun
    run_b: EvalRun
    # The item results, loaded only ``with_results`` (for reports): a comparison reads just the scores.
    results_a: list[EvalItemResult] | None
    results_b: list[EvalItemResult] | None
    comparison: Comparison
    seconds: float  # loading both runs' results and comparing them


async def compare_runs(runs: EvalRunRepository, a: str, b: str, *, allow_different_datasets: bool = False,
                       confidence: float = 0.95, resamples: int = 10_000, worst: int = 10,
                       worst_by: str | None = None, with_results: bool = False,
                       scope: TenantScope | None = None) -> RunComparison:
    """Run B (the candidate) against run A (the baseline), paired by item; either given by id or name
    (and in ``scope``: a caller's tenant). ``with_results`` loads the whole results too (answers,
    retrieved lists), as a report needs."""
    started = time.perf_counter()
    run_a, run_b = await runs.find(a, scope), await runs.find(b, scope)
    if run_a.id == run_b.id:
        raise ConflictError(f"both sides are run {run_a.id}; compare two different runs")
    results_a = await runs.results(run_a.id) if with_results else None
    results_b = await runs.results(run_b.id) if with_results else None
    scores_a = run_scores(results_a if results_a is not None else await runs.scores(run_a.id))
    scores_b = run_scores(results_b if results_b is not None else await runs.scores(run_b.id))
    comparison = compare(scores_a, scores_b, lower_is_better=LOWER_IS_BETTER,
                         confidence=confidence, resamples=resamples, seed=run_b.seed, worst=worst,
                         worst_by=worst_by, dataset_a=run_a.dataset.version, dataset_b=run_b.dataset.version,
                         allow_different_datasets=allow_different_datasets)
    return RunComparison(run_a, run_b, results_a, results_b, comparison, time.perf_counter() - started)
