"""The human-review queue's vocabulary: why an answer is queued, its states, and a reviewer's decision."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from rag_service.domain.evaluation import MetricName

ReviewStatus = Literal["pending", "claimed", "approved", "rejected", "edited", "expired"]
REVIEW_STATUSES: tuple[ReviewStatus, ...] = get_args(ReviewStatus)
DecisionKind = Literal["approved", "rejected", "edited"]
ReviewCategory = Literal["routing", "answer_quality", "relevance", "other"]
ReviewTier = Literal["high", "normal"]
ReviewTriggerSource = Literal["evaluator", "feedback"]
GateMode = Literal["deliver", "hold"]


class GateVerdict(BaseModel):
    """What the tiered gate decided for one evaluated answer."""

    model_config = ConfigDict(frozen=True)

    needs_review: bool
    tier: ReviewTier | None = Field(description="None when the answer is delivered without review.")
    reasons: tuple[str, ...] = ()
    flagged: tuple[MetricName, ...] = Field(default=(), description="Metrics below their own threshold.")
    hold: bool = Field(default=False, description="Hold mode: the caller waits for a reviewer.")


class ReviewTrigger(BaseModel):
    """A request to put an answer in the queue (idempotent per answer)."""

    model_config = ConfigDict(frozen=True)

    source: ReviewTriggerSource
    tier: ReviewTier
    reasons: tuple[str, ...]
    flagged: tuple[MetricName, ...] = ()
    overall: float | None = None
    held: bool = False
