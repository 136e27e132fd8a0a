"""Prompt and guideline versions, their labels and the audit of label moves, experiments between
two labels, and the API models of the learning loop."""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

PromptKind = Literal["prompt", "guidelines"]
VersionSource = Literal["default", "review", "manual", "optimizer"]
ExperimentStatus = Literal["running", "stopped", "promoted", "ended"]
Variant = Literal["control", "candidate"]
PRODUCTION = "production"
CANDIDATE = "candidate"
GUIDELINES_NAME = "router"  # the router's guidelines are versioned as kind "guidelines", this name

_LABEL = re.compile(r"^[a-z][a-z0-9_-]{0,39}$")


def check_label(label: str) -> str:
    if not _LABEL.match(label):
        raise ValueError(f"label {label!r} must be 1-40 characters: a lowercase letter, then lowercase "
                         "letters, digits, '-' or '_'")
    return label


def assignment_unit(conversation_id: str | None, api_key_id: str | None, query_id: str) -> str:
    """What an experiment's assignment is sticky to: the conversation, else the API key, else
    (a caller with neither) the query itself."""
    if conversation_id:
        return f"conversation:{conversation_id}"
    if api_key_id:
        return f"key:{api_key_id}"
    return f"query:{query_id}"


class PromptVersion(BaseModel):
    """One immutable version of a prompt (a Jinja2 template) or of the router's guidelines (JSON)."""

    model_config = ConfigDict(frozen=True)

    kind: PromptKind
    name: str
    version: int
    body: str
    parameters: dict[str, Any] = Field(default_factory=dict, description=(
        "LLM prompts: temperature, and tier to override the route's. The extractive generator: "
        "max_sentences, support_ratio, abstain_below."))
    author: str | None = None
    source: VersionSource
    note: str | None = None
    parent_version: int | None = None
    review_ids: list[uuid.UUID] = Field(default_factory=list, description="The reviews it was built from.")
    created_at: datetime | None = None
    labels: list[str] = Field(default_factory=list, description="The labels pointing at it now.")


class LabelMove(BaseModel):
    """One entry of a label's audit: who moved it, when, from which version to which, and why."""

    id: int
    kind: PromptKind
    name: str
    label: str
    from_version: int | None = Field(description="null: the label was new.")
    to_version: int
    actor: str | None
    reason: str | None
    forced: bool = False
    rollback: bool = Field(default=False, description="This move rolled the label back.")
    experiment_id: uuid.UUID | None = None
    created_at: datetime


class PromptSummary(BaseModel):
    kind: PromptKind
    name: str
    latest_version: int
    versions: int
    labels: dict[str, int] = Field(description="label -> version")


class PromptChoice(BaseModel):
    """The version a query uses, and the experiment that chose it (if any)."""

    model_config = ConfigDict(frozen=True)

    version: PromptVersion
    experiment_id: uuid.UUID | None = None
    variant: Variant | None = None


class NewVersionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    body: str | None = Field(default=None, min_length=1, max_length=50_000, description=(
        "The template (with [system]/[user] sections), or for guidelines their JSON. Default: the parent's."))
    parameters: dict[str, Any] | None = Field(default=None, description=(
        "Merged over the parent's (a null value removes one)."))
    parent_version: int | None = Field(default=None, ge=1, description="Default: the production version.")
    note: str | None = Field(default=None, max_length=2_000)
    label: str | None = Field(default=None, description="A label to point at the new version, e.g. candidate.")

    @field_validator("label")
    @classmethod
    def _label(cls, value: str | None) -> str | None:
        return None if value is None else check_label(value)


class MoveLabelRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = Field(ge=1)
    reason: str | None = Field(default=None, max_length=2_000)
    eval_run: str | None = Field(default=None, min_length=1, max_length=200, description=(
        "Moving production: a finished eval run (id or name) made with this version; the offline gate compares it "
        "with production's run on the same data (required when RAGSVC_PROMOTION_REQUIRES_EVAL_RUN is set)."))


class RollbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    label: str = Field(default=PRODUCTION)
    reason: str | None = Field(default=None, max_length=2_000)

    @field_validator("label")
    @classmethod
    def _label(cls, value: str) -> str:
        return check_label(value)


class PromptDiff(BaseModel):
    name: str
    kind: PromptKind
    from_version: int
    to_version: int
    body_diff: str = Field(description="A unified diff of the bodies.")
    parameters_changed: dict[str, list[Any]] = Field(description="parameter -> [old, new] for each that differs.")


class ExperimentRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200, description="The prompt, e.g. answer_extractive.")
    control_label: str = PRODUCTION
    candidate_label: str = CANDIDATE
    share: float = Field(default=0.5, gt=0, lt=1, description="The candidate's share of traffic.")
    alpha: float = Field(default=0.05, gt=0, lt=0.5, description="The sequential test's error rate.")
    tau: float = Field(default=0.05, gt=0, le=1, description=(
        "The mixing prior's standard deviation: the size of difference the test is most sensitive to."))
    note: str | None = Field(default=None, max_length=2_000)

    @field_validator("control_label", "candidate_label")
    @classmethod
    def _labels(cls, value: str) -> str:
        return check_label(value)


class PromoteRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    force: bool = Field(default=False, description="Promote although the evidence does not say it wins (recorded); "
                                                   "does not override the offline gate.")
    reason: str | None = Field(default=None, max_length=2_000)
    eval_run: str | None = Field(default=None, min_length=1, max_length=200, description=(
        "A finished eval run (id or name) made with the candidate version; the offline gate compares it with "
        "production's run on the same data (required when RAGSVC_PROMOTION_REQUIRES_EVAL_RUN is set)."))


class MetricComparison(BaseModel):
    """The always-valid test of one metric between the variants (mixture SPRT)."""

    metric: str
    higher_is_better: bool
    control_mean: float | None
    candidate_mean: float | None
    difference: float | None = Field(description="candidate - control")
    lower: float | None = Field(description="The confidence sequence on the difference (null: too few yet).")
    upper: float | None
    p_value: float = Field(description="Always valid: may be read after every answer.")
    verdict: Literal["better", "worse", "undecided"]


class VariantStats(BaseModel):
    variant: Variant
    label: str
    version: int
    answers: int
    graded: int
    overall_mean: float | None
    metric_means: dict[str, float]
    review_rate: float | None = Field(description="Share of answers queued for review.")
    approval_rate: float | None = Field(description="Of decided reviews, the share approved.")
    latency_ms_p50: float | None
    latency_ms_p95: float | None
    tokens_mean: dict[str, float] | None = Field(default=None, description=(
        "Mean LLM tokens per answer that called the LLM ({prompt, completion}, as the server reported them)."))
    cost_usd: float | None = Field(description=(
        "Mean generation cost per answer: 0 for extractive answers; for LLM answers their tokens at "
        "RAGSVC_LLM_USD_PER_1K_PROMPT_TOKENS / _COMPLETION_TOKENS; null when prices or tokens are unknown."))
    overall_histogram: list[int] = Field(description="Overall scores in ten bins of 0.1.")


class Experiment(BaseModel):
    id: uuid.UUID
    name: str
    control_label: str
    candidate_label: str
    control_version: int
    candidate_version: int
    share: float
    alpha: float
    tau: float
    status: ExperimentStatus
    stop_reason: str | None
    started_by: str | None
    note: str | None
    created_at: datetime
    ended_at: datetime | None


class ExperimentReport(BaseModel):
    experiment: Experiment
    variants: list[VariantStats]
    comparisons: list[MetricComparison]
    decision: Literal["candidate_wins", "candidate_worse", "undecided"]
    decision_reason: str
