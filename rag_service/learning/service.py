"""The learning loop as the API, CLI and console use it: prompt and guideline versions with labels,
candidates from reviews, experiments and promotion. SQL lives in the repositories; the decisions
(candidates, statistics) are pure functions in this package.

It also chooses the prompt version each query uses (``PromptSource`` in the pipeline): the
``production`` label, or under a running experiment the variant its assignment unit draws.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from pydantic import ValidationError

from rag_service.db.repos.experiments import ExperimentRepository
from rag_service.db.repos.prompts import PromptRepository
from rag_service.domain import Caller, GuidelineSet
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
from rag_service.errors import ConflictError, InvalidInputError, NotFoundError
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

# What a version's parameters may hold, by prompt; unknown keys are refused so a typo is not
# silently ignored. LLM prompts share theirs.
_LLM_PARAMETERS = {"temperature": (int, float), "tier": str, "max_tokens": int}
PARAMETERS: dict[str, dict[str, Any]] = {
    "answer_extractive": {"max_sentences": int, "support_ratio": (int, float), "abstain_below": (int, float)},
}


def actor(caller: Caller) -> str:
    return caller.label


def check_body(kind: PromptKind, name: str, body: str, parameters: dict[str, Any]) -> None:
    """Raise InvalidInputError naming what to fix in a new version."""
    try:
        if kind == "guidelines":
            GuidelineSet.model_validate_json(body)
        else:
            validate_template(body)
    except (ValueError, ValidationError) as exc:
        what = "guidelines JSON" if kind == "guidelines" else "template"
        raise InvalidInputError(f"the new version's {what} is invalid: {str(exc).splitlines()[0]}") from exc
    allowed = PARAMETERS.get(name, _LLM_PARAMETERS) if kind == "prompt" else {}
    for key, value in parameters.items():
        if key not in allowed:
            raise InvalidInputError(f"parameter {key!r} is not used by {name!r}; known: {sorted(allowed)}")
        if isinstance(value, bool) or not isinstance(value, allowed[key]):
            raise InvalidInputError(f"parameter {key!r} has the wrong type ({type(value).__name__})")


class PromptService:
    def __init__(self, prompts: PromptRepository, experiments: ExperimentRepository) -> None:
        self.prompts = prompts
        self.experiments = experiments

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
        return await self.prompts.create(kind, name, body=body, parameters=parameters, author=actor(caller),
                                         source=source, note=request.note, parent_version=parent.version,
                                         review_ids=review_ids, label=request.label)

    async def move_label(self, caller: Caller, kind: PromptKind, name: str, label: str, version: int,
                         reason: str | None) -> LabelMove:
        check_label(label)
        if kind == "prompt" and label in (PRODUCTION,):
            running = await self.prompts.running_experiment(name)
            if running is not None:
                raise ConflictError(f"an experiment ({running.id}) is running on {name!r}: promote or stop it "
                                    "instead of moving production by hand", fields={"experiment_id": str(running.id)})
        return await self.prompts.move_label(kind, name, label, version, actor=actor(caller), reason=reason)

    async def rollback(self, caller: Caller, kind: PromptKind, name: str, label: str = PRODUCTION,
                       reason: str | None = None) -> LabelMove:
        if kind == "prompt" and label == PRODUCTION:
            running = await self.prompts.running_experiment(name)
            if running is not None:  # a rollback is an emergency: traffic goes back to control too
                await self.experiments.end(running.id, "stopped", "rollback of production")
        return await self.prompts.rollback(kind, name, label, actor=actor(caller), reason=reason)

    async def diff(self, kind: PromptKind, name: str, old: int, new: int) -> PromptDiff:
        a, b = await self.prompts.version(kind, name, old), await self.prompts.version(kind, name, new)
        return PromptDiff(name=name, kind=kind, from_version=old, to_version=new,
                          body_diff=diff_bodies(a.body, b.body, f"{name} v{old}", f"{name} v{new}"),
                          parameters_changed=changed_parameters(a.parameters, b.parameters))

    async def guidelines(self) -> tuple[int, GuidelineSet]:
        version = await self.prompts.by_label("guidelines", GUIDELINES_NAME, PRODUCTION)
        return version.version, GuidelineSet.model_validate_json(version.body)

    # --- experiments ----------------------------------------------------------------------------------

    async def start_experiment(self, caller: Caller, request: ExperimentRequest) -> Experiment:
        if request.control_label == request.candidate_label:
            raise InvalidInputError("control_label and candidate_label must differ")
        control = await self.prompts.by_label("prompt", request.name, request.control_label)
        candidate = await self.prompts.by_label("prompt", request.name, request.candidate_label)
        if control.version == candidate.version:
            raise InvalidInputError(f"labels {request.control_label!r} and {request.candidate_label!r} both point "
                                    f"at version {control.version}: nothing to compare")
        return await self.experiments.start(request, control.version, candidate.version, actor(caller))

    async def experiment_report(self, experiment_id: uuid.UUID, *, enforce: bool = True) -> ExperimentReport:
        """Statistics and the decision so far. With ``enforce``, a running experiment whose candidate
        is significantly worse is stopped here (the guardrail): reading the report is what applies
        it, and the query path reads no statistics."""
        experiment = await self.experiments.get(experiment_id)
        result = report(experiment, await self.experiments.observations(experiment_id))
        if enforce and experiment.status == "running" and result.decision == "candidate_worse":
            stopped = await self.experiments.end(experiment_id, "stopped", f"guardrail: {result.decision_reason}")
            log.warning("experiment %s stopped by the guardrail: %s", experiment_id, result.decision_reason)
            result = result.model_copy(update={"experiment": stopped})
        return result

    async def check_running(self) -> list[ExperimentReport]:
        """Apply the guardrail to every running experiment (the server runs this periodically)."""
        running, _ = await self.experiments.list(limit=1000)
        return [await self.experiment_report(e.id) for e in running if e.status == "running"]

    async def stop_experiment(self, caller: Caller, experiment_id: uuid.UUID, reason: str | None) -> Experiment:
        return await self.experiments.end(experiment_id, "stopped", reason or f"stopped by {actor(caller)}")

    async def promote(self, caller: Caller, experiment_id: uuid.UUID, *, force: bool = False,
                      reason: str | None = None) -> tuple[LabelMove, ExperimentReport]:
        """Move ``production`` to the candidate's version when the evidence says it wins (and,
        once offline evaluation runs exist, when its offline gate holds); ``force`` overrides and
        is recorded in the label's audit."""
        result = await self.experiment_report(experiment_id)
        experiment = result.experiment
        if experiment.status not in ("running", "stopped"):
            raise ConflictError(f"experiment {experiment_id} has already {experiment.status}",
                                fields={"experiment_id": str(experiment_id)})
        if result.decision != "candidate_wins" and not force:
            raise ConflictError(f"the candidate has not won: {result.decision_reason}. Collect more traffic, or "
                                "promote with force (recorded)", fields={"decision": result.decision})
        production = await self.prompts.by_label("prompt", experiment.name, PRODUCTION)
        why = reason or (f"experiment {experiment_id}: {result.decision_reason}" if not force
                         else f"forced by {actor(caller)} ({result.decision}: {result.decision_reason})")
        move = await self.prompts.move_label("prompt", experiment.name, PRODUCTION, experiment.candidate_version,
                                             actor=actor(caller), reason=why, forced=force and
                                             result.decision != "candidate_wins", experiment_id=experiment_id,
                                             expected_from=production.version)
        if experiment.status == "running":
            await self.experiments.end(experiment_id, "promoted", why)
        else:
            await self.experiments.mark(experiment_id, "promoted", why)
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
        if request.corrected_prompt and item.prompt_name:
            check_body("prompt", item.prompt_name, request.corrected_prompt, {})
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
        rows = await self.reviews.repository.reviewed_examples(name, limit=last)
        if not rows:
            raise NotFoundError(f"no approved or edited reviews of prompt {name!r} yet; decide some first")
        examples = worked_examples([ReviewedExample(str(r["review_id"]), r["question"], r["answer"]) for r in rows])
        body = with_examples(production.body, examples)
        source, note = "review", f"worked examples from {len(examples)} reviews"
        feedback = [r["feedback"] for r in rows if r.get("feedback")]
        if rewrite and self._rewrite is not None and feedback:
            try:
                rewritten = await self._rewrite(body, feedback)
                validate_template(rewritten)
                body, source, note = rewritten, "optimizer", note + f", rewritten by the LLM from {len(feedback)} " \
                                                                   "feedback texts"
            except Exception as exc:  # the examples-only candidate is still useful
                log.warning("the optimizer's rewrite was not usable (%s); proposing the examples only", exc)
                note += f" (LLM rewrite failed: {str(exc)[:200]})"
        return await self.prompts.create(caller, "prompt", name, NewVersionRequest(
            body=body, parent_version=production.version, label=CANDIDATE, note=note), source=source,
            review_ids=[uuid.UUID(str(r["review_id"])) for r in rows])

