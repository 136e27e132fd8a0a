"""The offline gate on promotion: a candidate prompt (or guidelines) version may become production
only with a finished eval run made with it that does not regress production's run on the same data.

The baseline is found, not named: the newest finished run on the same dataset version and mode whose
configuration is the candidate run's in everything but the version being promoted, made with the
version production has now. The two are compared item by item (``compare.py``) and gated
(``gate.py``): a metric that is significantly worse (Holm-adjusted) by more than its tolerance
refuses the promotion, and the refusal names the metric, the difference and its CI.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from evaluation.comparisons import compare_runs
from evaluation.gate import gate
from evaluation.sources import GUIDELINES_PIN, pinnable
from rag_service.db.repos.eval_runs import EvalRunRepository
from rag_service.db.repos.prompts import PromptRepository
from rag_service.domain import EvalRun
from rag_service.domain.prompts import GUIDELINES_NAME, PRODUCTION, PromptKind
from rag_service.errors import ConflictError


def _pin_key(kind: PromptKind, name: str) -> str:
    return GUIDELINES_PIN if kind == "guidelines" else name


def _without(config: dict[str, Any], key: str) -> dict[str, Any]:
    rest = copy.deepcopy(config)
    rest.get("prompts", {}).pop(key, None)
    return rest


class EvalPromotionGate:
    def __init__(self, runs: EvalRunRepository, prompts: PromptRepository, *, required: bool, tolerance: float,
                 tolerances: Mapping[str, float], answer_prompt: str) -> None:
        self._runs = runs
        self._prompts = prompts
        self.required = required
        # What an eval run can answer with another version of (evaluation.runner._versions): the gate
        # covers these; other prompts (the judge's, the optimiser's, the answer prompt this
        # configuration does not use) no eval run exercises, so none can be evidence for them.
        self._gated = pinnable(answer_prompt)
        self._tolerance = tolerance
        self._tolerances = dict(tolerances)

    def gates(self, kind: PromptKind, name: str) -> bool:
        return _pin_key(kind, name) in self._gated

    async def check(self, kind: PromptKind, name: str, version: int, eval_run: str | None) -> str | None:
        """None when no run was given and none is required; else the gate's reason for letting it pass.
        Raises ConflictError (409) when it refuses."""
        what = "the router's guidelines" if kind == "guidelines" else f"prompt {name!r}"
        if not self.gates(kind, name):
            if eval_run is not None:
                raise ConflictError(f"no eval run exercises {what} in this configuration (runs answer with "
                                    f"{sorted(self._gated)}), so none can gate it; move the label without one",
                                    fields={"eval_run": eval_run})
            return None
        if eval_run is None:
            if self.required:
                raise ConflictError(
                    f"promoting {what} needs an eval run made with version {version} "
                    f"(RAGSVC_PROMOTION_REQUIRES_EVAL_RUN): run `ragsvc eval run --mode full --prompt "
                    f"{_pin_key(kind, name)}={version} --name NAME ...` and promote with that run",
                    fields={"eval_run": None})
            return None
        run = await self._runs.find(eval_run)
        key = _pin_key(kind, name)
        if run.status != "finished":
            raise ConflictError(f"eval run {run.id} is {run.status}; the gate needs a finished run",
                                fields={"eval_run": str(run.id)})
        if run.mode != "full":
            raise ConflictError(f"eval run {run.id} ran retrieval only, which no prompt or guideline changes; the "
                                f"gate needs a full run (--mode full)", fields={"eval_run": str(run.id)})
        used = (run.config.get("prompts") or {}).get(key)
        if used != version:
            raise ConflictError(f"eval run {run.id} answered with {what} version {used}, not version {version}; "
                                f"run one with --prompt {key}={version}", fields={"eval_run": str(run.id)})
        production = await self._prompts.by_label(kind, GUIDELINES_NAME if kind == "guidelines" else name, PRODUCTION)
        baseline = await self._baseline(run, key, production.version)
        if baseline is None:
            raise ConflictError(
                f"no finished eval run of production ({what} version {production.version}) on dataset "
                f"{run.dataset.name}@{run.dataset.version}, mode {run.mode}, under the same configuration to compare "
                f"with; run one (`ragsvc eval run --dataset {run.request.dataset} --mode {run.mode}`)",
                fields={"eval_run": str(run.id)})
        if run.items_failed > baseline.items_failed:
            # Failed items are left out of the paired comparison, so a version that breaks answers must be
            # caught here: otherwise fewer, easier items would be compared and could pass.
            raise ConflictError(
                f"the offline gate refuses: {run.items_failed} items failed in eval run {run.id} (version "
                f"{version}) against {baseline.items_failed} in production's run {baseline.id}",
                fields={"eval_run": str(run.id), "baseline_run": str(baseline.id)})
        found = await compare_runs(self._runs, str(baseline.id), str(run.id))
        if not any(metric.n for metric in found.comparison.metrics):
            raise ConflictError(f"the offline gate refuses: eval runs {run.id} and {baseline.id} have no metric "
                                f"scored on the same items", fields={"eval_run": str(run.id)})
        tolerance = {m.metric: self._tolerances.get(m.metric, self._tolerance) for m in found.comparison.metrics}
        decision = gate(found.comparison, tolerance=tolerance)
        if not decision.passed:
            raise ConflictError(
                f"the offline gate refuses: eval run {run.id} (version {version}) against production's run "
                f"{baseline.id} (version {production.version}): {decision.reason}",
                fields={"eval_run": str(run.id), "baseline_run": str(baseline.id),
                        "failures": [f.model_dump() for f in decision.failures]})
        return f"eval run {run.id} against {baseline.id}: {decision.reason}"

    async def _baseline(self, run: EvalRun, key: str, production: int) -> EvalRun | None:
        rest = _without(run.config, key)
        for candidate in await self._runs.baselines(run.dataset.version, run.mode, exclude=[run.id]):
            same_items = (candidate.dataset.split, candidate.request.limit, candidate.request.repeat) == (
                run.dataset.split, run.request.limit, run.request.repeat)
            if (candidate.config.get("prompts") or {}).get(key) == production and same_items \
                    and _without(candidate.config, key) == rest:
                return candidate
        return None
