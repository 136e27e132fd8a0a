"""The learning loop as the API, CLI and console use it: prompt and guideline versions with labels,
candidates from reviews, experiments and promotion. SQL lives in the repositories; the decisions
(candidates, statistics) are pure functions in this package.

It also chooses the prompt version each query uses (``PromptSource`` in the pipeline): the
``production`` label, or under a running experiment the variant its assignment unit draws.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any, Protocol

from pydantic import ValidationError

from rag_service.db.repos.experiments import ExperimentRepository
from rag_service.db.repos.guidelines import GuidelineRepository
from rag_service.db.repos.prompts import PromptRepository
from rag_service.domain import DEFAULT_TENANT, Caller, GuidelineSet, TenantScope
from rag_service.domain.costs import Prices
from rag_service.domain.prompts import (
    CANDIDATE,
    GUIDELINES_NAME,
    PRODUCTION,
    Experiment,
    ExperimentReport,
    ExperimentRequest,
    LabelMove,
    NewVersionRequest,
    PromptChoice,
    PromptDiff,
    PromptKind,
    PromptVersion,
    check_label,
)
from rag_service.domain.review import ReviewDecisionPublic, ReviewDecisionRequest
from rag_service.errors import ConflictError, ForbiddenError, InvalidInputError, NotFoundError, RagServiceError
from rag_service.learning.assignment import assign
from rag_service.learning.candidates import (
    ReviewedExample,
    changed_parameters,
    diff_bodies,
    guideline_candidate,
    with_examples,
    worked_examples,
)
from rag_service.learning.report import report
from rag_service.prompts.registry import validate_template
from rag_service.review.service import ReviewService

log = logging.getLogger(__name__)

_TIERS = ("simple", "moderate", "complex")
# The prompts whose versions answer queries (the generators'); the judge and the optimizer have no traffic to split.
EXPERIMENTABLE = frozenset({"answer_cot", "answer_extractive"})


class OfflineGate(Protocol):
    """The offline evaluation gate on promotion (built in ``evaluation.promotion``, above this layer)."""

    required: bool  # production moves only with an eval run (RAGSVC_PROMOTION_REQUIRES_EVAL_RUN)

    def gates(self, kind: PromptKind, name: str) -> bool:
        """Whether an eval run can exercise this prompt (the others are not gated)."""
        ...

    async def check(self, kind: PromptKind, name: str, version: int, eval_run: str | None) -> str | None:
        """Raise ConflictError when ``version`` may not become production; else the reason it may
        (None: no eval run given, and none required)."""
        ...


def _label(label: str) -> str:
    try:
        return check_label(label)
    except ValueError as exc:
        raise InvalidInputError(str(exc)) from None


def actor(caller: Caller) -> str:
    return caller.label


def check_parameters(name: str, parameters: dict[str, Any]) -> None:
    """Raise InvalidInputError naming the parameter to fix: a version's parameters are read on
    every answer, so a bad one must be refused here, not fail queries later."""
    if name == "answer_extractive":
        known = {"max_sentences", "support_ratio", "abstain_below"}
    else:
        known = {"temperature", "tier", "max_tokens"}
    for key, value in parameters.items():
        if key not in known:
            raise InvalidInputError(f"parameter {key!r} is not used by {name!r}; known: {sorted(known)}")
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        problem = None
        if key == "max_sentences" and not (isinstance(value, int) and numeric and 1 <= value <= 10):
            problem = "an integer from 1 to 10"
        elif key in ("support_ratio", "abstain_below") and not (numeric and 0 <= value <= 1):
            problem = "a number from 0 to 1"
        elif key == "temperature" and not (numeric and 0 <= value <= 2):
            problem = "a number from 0 to 2"
        elif key == "max_tokens" and not (isinstance(value, int) and numeric and 16 <= value <= 16_384):
            problem = "an integer from 16 to 16384"
        elif key == "tier" and value not in _TIERS:
            problem = f"one of {list(_TIERS)}"
        if problem:
            raise InvalidInputError(f"parameter {key!r} must be {problem}, not {value!r}")


def check_body(kind: PromptKind, name: str, body: str, parameters: dict[str, Any]) -> None:
    """Raise InvalidInputError naming what to fix in a new version."""
    try:
        if kind == "guidelines":
            GuidelineSet.model_validate_json(body)
        else:
            validate_template(body, name)
    except (ValueError, ValidationError) as exc:
        what = "guidelines JSON" if kind == "guidelines" else "template"
        raise InvalidInputError(f"the new version's {what} is invalid: {str(exc).splitlines()[0]}") from exc
    if kind == "prompt":
        check_parameters(name, parameters)
    elif parameters:
        raise InvalidInputError("guidelines versions take no parameters")


class PromptService:
    def __init__(self, prompts: PromptRepository, experiments: ExperimentRepository,
                 prices: Prices | None = None, offline_gate: OfflineGate | None = None) -> None:
        self.prompts = prompts
        self.experiments = experiments
        self.prices = prices or Prices()
        self.offline_gate = offline_gate

    async def _offline(self, kind: PromptKind, name: str, version: int, eval_run: str | None) -> str | None:
        if self.offline_gate is None:
            if eval_run is not None:
                raise InvalidInputError("this process has no eval runs to gate on")
            return None
        return await self.offline_gate.check(kind, name, version, eval_run)

    def refuse_ungated_production(self, kind: PromptKind, name: str, what: str) -> None:
        """Paths that would make a version production with no eval run to show for it (a new version
        labelled production, PUT /v1/guidelines) are closed while the gate is required."""
        gate = self.offline_gate
        if gate is not None and gate.required and gate.gates(kind, name):
            raise ConflictError(
                f"{what} cannot become production directly while RAGSVC_PROMOTION_REQUIRES_EVAL_RUN is set: store "
                f"it as a version without the production label, run `ragsvc eval run --mode full --prompt "
                f"NAME=VERSION ...` with it, then move the label with --eval-run")

    # --- the query path ----------------------------------------------------------------------------

    async def choose(self, name: str, unit: str) -> PromptChoice:
        """The version of prompt ``name`` this query uses: the running experiment's variant for
        ``unit`` (sticky), else ``production``."""
        experiment = await self.prompts.running_experiment(name)
        if experiment is None:
            return PromptChoice(version=await self.prompts.by_label("prompt", name, PRODUCTION))
        variant = assign(str(experiment.id), unit, experiment.share)
        number = experiment.candidate_version if variant == "candidate" else experiment.control_version
        label = experiment.candidate_label if variant == "candidate" else experiment.control_label
        version = await self.prompts.by_label("prompt", name, label)
        if version.version != number:  # the label moved during the experiment: use the pinned version
            version = await self.prompts.pinned("prompt", name, number)
        return PromptChoice(version=version, experiment_id=experiment.id, variant=variant)

    # --- versions and labels ------------------------------------------------------------------------

    async def create(self, caller: Caller, kind: PromptKind, name: str, request: NewVersionRequest, *,
                     source: str = "manual", review_ids: list[uuid.UUID] | None = None) -> PromptVersion:
        parent_number = request.parent_version
        if parent_number is None:
            parent = await self.prompts.by_label(kind, name, PRODUCTION)
        else:
            parent = await self.prompts.version(kind, name, parent_number)
        body = request.body if request.body is not None else parent.body
        # Given parameters are merged over the parent's; null removes one.
        merged = {**parent.parameters, **(request.parameters or {})}
        parameters = {k: v for k, v in merged.items() if v is not None}
        check_body(kind, name, body, parameters)
        if request.label == PRODUCTION:
            self.refuse_ungated_production(kind, name, f"a new version of {name!r}")
            await self._no_experiment(kind, name)
        return await self.prompts.create(kind, name, body=body, parameters=parameters, author=actor(caller),
                                         source=source, note=request.note, parent_version=parent.version,
                                         review_ids=review_ids, label=request.label)

    async def move_label(self, caller: Caller, kind: PromptKind, name: str, label: str, version: int,
                         reason: str | None, eval_run: str | None = None) -> LabelMove:
        """Move a label; moving ``production`` passes the offline gate first (``eval_run``)."""
        _label(label)
        if label == PRODUCTION:
            await self._no_experiment(kind, name)
            passed = await self._offline(kind, name, version, eval_run)
            if passed is not None:
                reason = f"{reason}; offline gate: {passed}" if reason else f"offline gate: {passed}"
        return await self.prompts.move_label(kind, name, label, version, actor=actor(caller), reason=reason)

    async def _no_experiment(self, kind: PromptKind, name: str) -> None:
        """While an experiment runs on a prompt, production moves only by promote or rollback."""
        running = await self.prompts.running_experiment(name) if kind == "prompt" else None
        if running is not None:
            raise ConflictError(f"an experiment ({running.id}) is running on {name!r}: promote or stop it "
                                "instead of moving production by hand", fields={"experiment_id": str(running.id)})

    async def rollback(self, caller: Caller, kind: PromptKind, name: str, label: str = PRODUCTION,
                       reason: str | None = None) -> LabelMove:
        """The label back where it was before its last move not yet rolled back. A running
        experiment on the prompt is stopped after the move (a rollback is an emergency: all
        traffic goes back to production)."""
        _label(label)
        move = await self.prompts.rollback(kind, name, label, actor=actor(caller), reason=reason)
        running = await self.prompts.running_experiment(name) if kind == "prompt" and label == PRODUCTION else None
        if running is not None:
            await self.experiments.end(running.id, "stopped", f"rollback of production by {actor(caller)}")
            self.prompts.forget(kind, name)
        return move

    async def diff(self, kind: PromptKind, name: str, old: int, new: int) -> PromptDiff:
        a, b = await self.prompts.version(kind, name, old), await self.prompts.version(kind, name, new)
        return PromptDiff(name=name, kind=kind, from_version=old, to_version=new,
                          body_diff=diff_bodies(a.body, b.body, f"{name} v{old}", f"{name} v{new}"),
                          parameters_changed=changed_parameters(a.parameters, b.parameters))

    async def guidelines(self) -> tuple[int, GuidelineSet]:
        return await GuidelineRepository(self.prompts).current()

    # --- experiments ----------------------------------------------------------------------------------

    async def start_experiment(self, caller: Caller, request: ExperimentRequest) -> Experiment:
        if request.name not in EXPERIMENTABLE:
            raise InvalidInputError(f"experiments split answer traffic, so they run on the answer prompts "
                                    f"{sorted(EXPERIMENTABLE)}, not {request.name!r}")
        if request.control_label == request.candidate_label:
            raise InvalidInputError("control_label and candidate_label must differ")
        control = await self.prompts.by_label("prompt", request.name, request.control_label)
        candidate = await self.prompts.by_label("prompt", request.name, request.candidate_label)
        if control.version == candidate.version:
            raise InvalidInputError(f"labels {request.control_label!r} and {request.candidate_label!r} both point "
                                    f"at version {control.version}: nothing to compare")
        started = await self.experiments.start(request, control.version, candidate.version, actor(caller))
        self.prompts.forget("prompt", request.name)  # this process sees it at once; others by NOTIFY
        return started

    async def experiment_report(self, experiment_id: uuid.UUID, *, enforce: bool = True) -> ExperimentReport:
        """Statistics and the decision so far. With ``enforce``, a running experiment whose candidate
        is significantly worse is stopped here (the guardrail): reading the report is what applies
        it, and the query path reads no statistics."""
        experiment = await self.experiments.get(experiment_id)
        result = report(experiment, await self.experiments.observations(experiment_id), self.prices)
        if enforce and experiment.status == "running" and result.decision == "candidate_worse":
            stopped = await self.experiments.end(experiment_id, "stopped", f"guardrail: {result.decision_reason}")
            self.prompts.forget("prompt", experiment.name)
            log.warning("experiment %s stopped by the guardrail: %s", experiment_id, result.decision_reason)
            result = result.model_copy(update={"experiment": stopped})
        return result

    async def check_running(self) -> list[ExperimentReport]:
        """Apply the guardrail to every running experiment (the server runs this periodically)."""
        reports = []
        for experiment in await self.experiments.running():
            try:
                reports.append(await self.experiment_report(experiment.id))
            except RagServiceError as exc:  # e.g. another process ended it meanwhile: check the others
                log.warning("guardrail check of experiment %s failed: %s", experiment.id, exc)
        return reports

    async def stop_experiment(self, caller: Caller, experiment_id: uuid.UUID, reason: str | None) -> Experiment:
        stopped = await self.experiments.end(experiment_id, "stopped", reason or f"stopped by {actor(caller)}")
        self.prompts.forget("prompt", stopped.name)
        return stopped

    async def promote(self, caller: Caller, experiment_id: uuid.UUID, *, force: bool = False,
                      reason: str | None = None, eval_run: str | None = None) -> tuple[LabelMove, ExperimentReport]:
        """Move ``production`` to the candidate's version when the evidence says it wins and the
        offline gate holds (``eval_run``: a finished eval run made with the candidate). ``force``
        overrides the experiment's evidence, recorded in the label's audit, but not the offline gate:
        a run that shows a significant regression is a fact, not a judgement call."""
        result = await self.experiment_report(experiment_id)
        experiment = result.experiment
        if experiment.status not in ("running", "stopped"):
            raise ConflictError(f"experiment {experiment_id} has already {experiment.status}",
                                fields={"experiment_id": str(experiment_id)})
        if result.decision != "candidate_wins" and not force:
            raise ConflictError(f"the candidate has not won: {result.decision_reason}. Collect more traffic, or "
                                "promote with force (recorded)", fields={"decision": result.decision})
        why = reason or (f"experiment {experiment_id}: {result.decision_reason}" if not force
                         else f"forced by {actor(caller)} ({result.decision}: {result.decision_reason})")
        passed = await self._offline("prompt", experiment.name, experiment.candidate_version, eval_run)
        if passed is not None:
            why = f"{why}; offline gate: {passed}"
        move = await self.prompts.move_label("prompt", experiment.name, PRODUCTION, experiment.candidate_version,
                                             actor=actor(caller), reason=why, forced=force and
                                             result.decision != "candidate_wins", experiment_id=experiment_id,
                                             # The evidence compares the candidate with the control
                                             # version: production must still be it (checked under
                                             # the label's row lock; 409 otherwise).
                                             expected_from=experiment.control_version)
        # After the move (which may refuse): marking works whether or not it still runs.
        await self.experiments.end(experiment_id, "promoted", why, running_only=False)
        self.prompts.forget("prompt", experiment.name)
        return move, await self.experiment_report(experiment_id, enforce=False)


class LearningReviews:
    """A reviewer's decision, and the candidates it yields: a corrected prompt becomes a candidate
    version of the answer's prompt, a routing correction a candidate guidelines version; both
    name the review they came from. ``propose`` builds a candidate from many reviews."""

    def __init__(self, reviews: ReviewService, prompts: PromptService, llm_rewrite: Any = None) -> None:
        self.reviews = reviews
        self.prompts = prompts
        self._rewrite = llm_rewrite  # async (template, feedback texts) -> template, when an LLM is configured

    async def decide(self, caller: Caller, review_id: uuid.UUID,
                     request: ReviewDecisionRequest) -> ReviewDecisionPublic:
        """Record the decision, then the candidates its corrections ask for. The corrections are
        checked first, so a bad template or rule is a 422 before anything is stored."""
        item = await self.reviews.get(caller, review_id)
        guidelines = None
        if (request.corrected_prompt or request.corrected_routing) and caller.tenant != DEFAULT_TENANT:
            # Corrections become candidate versions of the prompt and guidelines every tenant shares.
            raise ForbiddenError("corrected_prompt and corrected_routing change the prompts and guidelines every "
                                 f"tenant shares: only reviewers of the {DEFAULT_TENANT!r} tenant send them; decide "
                                 "with corrected_answer instead")
        if request.corrected_prompt and item.prompt_name:
            try:
                check_body("prompt", item.prompt_name, request.corrected_prompt, {})
            except InvalidInputError as exc:
                raise InvalidInputError(f"corrected prompt: {exc.message}") from exc
        if request.corrected_routing:
            _, current = await self.prompts.guidelines()
            try:
                guidelines = guideline_candidate(current, request.corrected_routing,
                                                 query_type=item.intent.get("query_type"),
                                                 matched=item.route.get("guideline"), review_id=str(review_id))
            except (ValueError, ValidationError) as exc:
                raise InvalidInputError(f"corrected_routing: {str(exc).splitlines()[0]}") from exc
        decision = await self.reviews.decide(caller, review_id, request)
        update: dict[str, Any] = {}
        if request.corrected_prompt and item.prompt_name:
            version = await self.prompts.create(caller, "prompt", item.prompt_name, NewVersionRequest(
                body=request.corrected_prompt, parent_version=item.prompt_version, label=CANDIDATE,
                note=f"corrected prompt from review {review_id}"), source="review", review_ids=[review_id])
            update["candidate_prompt_version"] = version.version
        if guidelines is not None:
            version = await self.prompts.create(caller, "guidelines", GUIDELINES_NAME, NewVersionRequest(
                body=guidelines.model_dump_json(indent=2, exclude_none=True), label=CANDIDATE,
                note=f"routing correction from review {review_id}"), source="review", review_ids=[review_id])
            update["candidate_guidelines_version"] = version.version
        return decision.model_copy(update=update)

    async def propose(self, caller: Caller, name: str, *, last: int = 20, rewrite: bool = True) -> PromptVersion:
        """A candidate version of prompt ``name`` from its last ``last`` approved or edited reviews:
        their question/answer pairs as worked examples (deduplicated, length-bounded) and, with an
        LLM configured, the template rewritten from the reviewers' feedback texts."""
        production = await self.prompts.prompts.by_label("prompt", name, PRODUCTION)
        # Only the caller's tenant's reviews: the prompt serves every tenant, so it must not carry
        # another tenant's questions and answers (the routes let only the default tenant's admins propose).
        rows = await self.reviews.repository.reviewed_examples(name, limit=last, scope=TenantScope(caller.tenant))
        if not rows:
            raise NotFoundError(f"no approved or edited reviews of prompt {name!r} yet; decide some first")
        examples = worked_examples([ReviewedExample(str(r["review_id"]), r["question"], r["answer"]) for r in rows])
        body = with_examples(production.body, examples)
        source, note = "review", f"worked examples from {len(examples)} reviews"
        feedback = [r["feedback"] for r in rows if r.get("feedback")]
        if rewrite and self._rewrite is not None and feedback:
            try:
                rewritten = await self._rewrite(body, feedback)
                validate_template(rewritten, name)
                body, source, note = rewritten, "optimizer", note + f", rewritten by the LLM from {len(feedback)} " \
                                                                   "feedback texts"
            except Exception as exc:  # the examples-only candidate is still useful
                log.warning("the optimizer's rewrite was not usable (%s); proposing the examples only", exc)
                note += f" (LLM rewrite failed: {str(exc)[:200]})"
        return await self.prompts.create(caller, "prompt", name, NewVersionRequest(
            body=body, parent_version=production.version, label=CANDIDATE, note=note), source=source,
            review_ids=[uuid.UUID(str(r["review_id"])) for r in rows])

