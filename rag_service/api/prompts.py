"""Prompt and guideline versions with labels, and experiments between two labels.

/v1/prompts/{name}/... and /v1/guidelines/... share one set of routes (``_versioned``): versions
(list, show, create), diff, labels with their audit, moving a label, rollback. /v1/prompts/{name}/propose
builds a candidate from reviews; /v1/experiments starts, reports, stops and promotes. Reading needs
the reviewer role, every write the admin role; all of them a key of the default tenant (the
operator's), since prompts and guidelines serve every tenant."""


import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from rag_service.api.auth import AdminDep, ReviewerDep, operator_only, role
from rag_service.api.deps import RuntimeDep
from rag_service.domain.prompts import (
    GUIDELINES_NAME,
    Experiment,
    ExperimentReport,
    ExperimentRequest,
    LabelMove,
    MoveLabelRequest,
    NewVersionRequest,
    PromoteRequest,
    PromptDiff,
    PromptKind,
    PromptSummary,
    PromptVersion,
    RollbackRequest,
)

# Shared by every tenant: the default tenant's keys only (api/auth.py).
router = APIRouter(prefix="/v1", dependencies=[Depends(operator_only)])
experiments_router = APIRouter(prefix="/v1/experiments", tags=["experiments"], dependencies=[Depends(operator_only)])

_NOT_FOUND = {404: {"description": "No such prompt, version or label"}}
NameParam = Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[a-z0-9_]+$")]
LabelParam = Annotated[str, Path(min_length=1, max_length=40, pattern=r"^[a-z][a-z0-9_-]*$",
                                  description="Lowercase letters, digits, '-' or '_', starting with a letter.")]


class VersionsPage(BaseModel):
    data: list[PromptVersion]
    count: int


class LabelsView(BaseModel):
    labels: dict[str, int] = Field(description="label -> version")
    moves: list[LabelMove] = Field(description="The audit, newest first.")


class MovedLabel(BaseModel):
    move: LabelMove


class ProposeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    last: int = Field(default=20, ge=1, le=200, description="How many recent approved or edited reviews to read.")
    rewrite: bool = Field(default=True, description="With an LLM configured, let the optimizer rewrite the template.")


class ExperimentsPage(BaseModel):
    data: list[Experiment]
    count: int


class Promotion(BaseModel):
    move: LabelMove
    report: ExperimentReport


class StopRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(default=None, max_length=2_000)


@router.get("/prompts", response_model=list[PromptSummary], tags=["prompts"], summary="Prompts and guidelines",
            description="Every versioned prompt (and the router's guidelines, kind `guidelines`) with its labels.",
            **role("reviewer"))
async def list_prompts(runtime: RuntimeDep, caller: ReviewerDep,
                       kind: Annotated[PromptKind | None, Query()] = None) -> list[PromptSummary]:
    return await runtime.prompt_repository.summaries(kind)


def _versioned(kind: PromptKind, prefix: str, fixed_name: str | None) -> None:
    """The version, label and rollback routes of one kind under ``prefix``; prompts take their
    name from the path, guidelines have one (``router``)."""
    tag = "prompts" if kind == "prompt" else "guidelines"
    noun = "the prompt" if kind == "prompt" else "the router's guidelines"

    # FastAPI reads parameters from signatures, so prompts and guidelines get a function each.
    if kind == "prompt":
        def names(name: NameParam) -> str:
            return name
    else:
        def names() -> str:  # type: ignore[misc]
            return fixed_name or GUIDELINES_NAME

    NameDep = Annotated[str, Depends(names)]

    @router.get(f"{prefix}/versions", response_model=VersionsPage, tags=[tag], summary=f"Versions of {noun}",
                description="Newest first, with the labels pointing at each.", responses=_NOT_FOUND,
                **role("reviewer"))
    async def list_versions(runtime: RuntimeDep, caller: ReviewerDep, name: NameDep,
                            limit: Annotated[int, Query(ge=1, le=200)] = 50,
                            offset: Annotated[int, Query(ge=0)] = 0) -> VersionsPage:
        data, count = await runtime.prompt_repository.versions(kind, name, limit=limit, offset=offset)
        return VersionsPage(data=data, count=count)

    @router.get(f"{prefix}/versions/{{version}}", response_model=PromptVersion, tags=[tag],
                summary=f"One version of {noun}", responses=_NOT_FOUND, **role("reviewer"))
    async def get_version(version: Annotated[int, Path(ge=1)], runtime: RuntimeDep, caller: ReviewerDep,
                          name: NameDep) -> PromptVersion:
        return await runtime.prompt_repository.version(kind, name, version)

    @router.post(f"{prefix}/versions", response_model=PromptVersion, status_code=201, tags=[tag],
                 summary=f"Create a version of {noun}",
                 description="Versions are immutable. The body and parameters default to the parent's (default "
                             "parent: production); `label` points a label (e.g. `candidate`) at it in the same step. "
                             "The template must have [system]/[user] sections and valid Jinja2; guidelines must "
                             "validate. Source `manual`, author your key.",
                 responses={**_NOT_FOUND, 422: {"description": "Invalid template, guidelines or parameters"}},
                 **role("admin"))
    async def create_version(body: NewVersionRequest, runtime: RuntimeDep, caller: AdminDep,
                             name: NameDep) -> PromptVersion:
        return await runtime.prompts.create(caller, kind, name, body)

    @router.get(f"{prefix}/diff", response_model=PromptDiff, tags=[tag], summary=f"Diff two versions of {noun}",
                responses=_NOT_FOUND, **role("reviewer"))
    async def diff(runtime: RuntimeDep, caller: ReviewerDep, name: NameDep,
                   from_version: Annotated[int, Query(alias="from", ge=1)],
                   to_version: Annotated[int, Query(alias="to", ge=1)]) -> PromptDiff:
        return await runtime.prompts.diff(kind, name, from_version, to_version)

    @router.get(f"{prefix}/labels", response_model=LabelsView, tags=[tag], summary=f"Labels of {noun}",
                description="Where each label points, and every move (who, when, from, to, why).",
                responses=_NOT_FOUND, **role("reviewer"))
    async def labels(runtime: RuntimeDep, caller: ReviewerDep, name: NameDep,
                     limit: Annotated[int, Query(ge=1, le=500)] = 50) -> LabelsView:
        return LabelsView(labels=await runtime.prompt_repository.labels(kind, name),
                          moves=await runtime.prompt_repository.moves(kind, name, limit=limit))

    @router.put(f"{prefix}/labels/{{label}}", response_model=MovedLabel, tags=[tag], summary="Move a label",
                description="Points the label at a version and records the move. Moving `production` takes effect "
                            "in every process at once (LISTEN/NOTIFY). While an experiment runs on a prompt, its "
                            "production label moves only by promote or rollback (409).",
                responses={**_NOT_FOUND, 409: {"description": "An experiment is running"}}, **role("admin"))
    async def move_label(label: LabelParam, body: MoveLabelRequest, runtime: RuntimeDep, caller: AdminDep,
                         name: NameDep) -> MovedLabel:
        return MovedLabel(move=await runtime.prompts.move_label(caller, kind, name, label, body.version, body.reason,
                                                                eval_run=body.eval_run))

    @router.post(f"{prefix}/rollback", response_model=MovedLabel, tags=[tag], summary="Roll a label back",
                 description="Points the label (default `production`) back at the version it pointed at before its "
                             "last move, in one call; a running experiment on the prompt is stopped.",
                 responses={**_NOT_FOUND, 409: {"description": "Nothing to roll back to"}}, **role("admin"))
    async def rollback(body: RollbackRequest, runtime: RuntimeDep, caller: AdminDep, name: NameDep) -> MovedLabel:
        return MovedLabel(move=await runtime.prompts.rollback(caller, kind, name, body.label, body.reason))



_versioned("prompt", "/prompts/{name}", None)
_versioned("guidelines", "/guidelines", GUIDELINES_NAME)


@router.post("/prompts/{name}/propose", response_model=PromptVersion, status_code=201, tags=["prompts"],
             summary="Propose a candidate from reviews",
             description="Turns the last N approved or edited reviews of answers made with this prompt into a "
                         "candidate version (label `candidate`): their question/answer pairs as worked examples, "
                         "deduplicated and length-bounded; with an LLM configured, the optimizer prompt also "
                         "rewrites the template from the reviewers' feedback. The version lists the reviews.",
             responses={404: {"description": "No such prompt, or no reviews to learn from"}}, **role("admin"))
async def propose(name: NameParam, body: ProposeRequest, runtime: RuntimeDep, caller: AdminDep) -> PromptVersion:
    return await runtime.learning.propose(caller, name, last=body.last, rewrite=body.rewrite)


@experiments_router.get("", response_model=ExperimentsPage, summary="Experiments", **role("reviewer"))
async def list_experiments(runtime: RuntimeDep, caller: ReviewerDep,
                           name: Annotated[str | None, Query(max_length=200)] = None,
                           limit: Annotated[int, Query(ge=1, le=200)] = 50,
                           offset: Annotated[int, Query(ge=0)] = 0) -> ExperimentsPage:
    data, count = await runtime.prompts.experiments.list(name, limit=limit, offset=offset)
    return ExperimentsPage(data=data, count=count)


@experiments_router.post("", response_model=Experiment, status_code=201, summary="Start an experiment",
                         description="Sends `share` of traffic to the version the candidate label points at and the "
                                     "rest to the control label's, sticky per conversation (else per API key). The "
                                     "versions are pinned at the start.",
                         responses={404: {"description": "No such prompt or label"},
                                    409: {"description": "An experiment is already running on this prompt"}},
                         **role("admin"))
async def start_experiment(body: ExperimentRequest, runtime: RuntimeDep, caller: AdminDep) -> Experiment:
    return await runtime.prompts.start_experiment(caller, body)


@experiments_router.get("/{experiment_id}", response_model=ExperimentReport, summary="An experiment's report",
                        description="Per variant: answers, mean overall and per-metric scores, review and approval "
                                    "rates, latency, cost, the overall-score histogram. Per metric: the always-valid "
                                    "test (mixture SPRT; may be read after every answer). Reading it applies the "
                                    "guardrail: a candidate significantly worse on overall score or review rate stops "
                                    "the experiment and all traffic returns to the control.",
                        responses={404: {"description": "No such experiment"}}, **role("reviewer"))
async def experiment_report(experiment_id: uuid.UUID, runtime: RuntimeDep, caller: ReviewerDep) -> ExperimentReport:
    return await runtime.prompts.experiment_report(experiment_id)


@experiments_router.post("/{experiment_id}/stop", response_model=Experiment, summary="Stop an experiment",
                         responses={404: {"description": "No such experiment"},
                                    409: {"description": "Not running"}}, **role("admin"))
async def stop_experiment(experiment_id: uuid.UUID, body: StopRequest, runtime: RuntimeDep,
                          caller: AdminDep) -> Experiment:
    return await runtime.prompts.stop_experiment(caller, experiment_id, body.reason)


@experiments_router.post("/{experiment_id}/promote", response_model=Promotion, summary="Promote the candidate",
                         description="Moves `production` to the candidate's version when the candidate wins (better "
                                     "overall score, review rate not worse, both by the always-valid test). `force` "
                                     "promotes regardless and is recorded in the label's audit.",
                         responses={404: {"description": "No such experiment"},
                                    409: {"description": "The candidate has not won (the body says why), or the "
                                                         "experiment has ended"}}, **role("admin"))
async def promote(experiment_id: uuid.UUID, body: PromoteRequest, runtime: RuntimeDep, caller: AdminDep) -> Promotion:
    move, report = await runtime.prompts.promote(caller, experiment_id, force=body.force, reason=body.reason,
                                                 eval_run=body.eval_run)
    return Promotion(move=move, report=report)
