"""The human-review queue's vocabulary (why an answer is queued, its states, a reviewer's
decision), the queue's priority weights, and the review and answer APIs' models."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rag_service.domain.answers import Citation
from rag_service.domain.evaluation import MetricName, MetricValue
from rag_service.domain.tenants import CollectionKey

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


# --- the queue's order ---------------------------------------------------------------------------


class PriorityPolicy(BaseModel):
    """The weights of the review priority (``rag_service.review.priority`` computes it; the
    repository's ORDER BY mirrors it). Each term lies in [0, 1], so the priority does too when
    the weights sum to 1."""

    model_config = ConfigDict(frozen=True)

    score_weight: float = Field(default=0.5, ge=0, description="Weight of 1 - overall (unknown overall: 1).")
    traffic_weight: float = Field(default=0.3, ge=0, description="Weight of the question's recent traffic.")
    age_weight: float = Field(default=0.2, ge=0, description="Weight of the item's age.")
    traffic_cap: int = Field(default=100, ge=1, description="Queries at which the traffic term reaches 1.")
    traffic_window_s: float = Field(default=7 * 86_400, gt=0, description="How far back traffic is counted.")
    age_horizon_s: float = Field(default=7 * 86_400, gt=0, description="Age at which the age term reaches 1.")


# --- API models ----------------------------------------------------------------------------------


class ReviewFilters(BaseModel):
    """What ``GET /v1/reviews`` and ``ragsvc review list`` narrow the queue by (all must hold)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: ReviewStatus | None = Field(default=None, description="Only items in this state.")
    reason: str | None = Field(default=None, min_length=1, max_length=200,
                               description="A substring of one of the item's reasons (case-insensitive).")
    metric: MetricName | None = Field(default=None, description="Only items that flagged this metric.")
    prompt_name: str | None = Field(default=None, max_length=200)
    prompt_version: int | None = Field(default=None, ge=1)
    collection: str | None = Field(default=None, max_length=200)


class ReviewItemSummary(BaseModel):
    """One queued answer, as the queue lists it."""

    id: uuid.UUID = Field(description="The review item.")
    answer_id: uuid.UUID = Field(description="The answer under review (its query id: GET /v1/answers/{answer_id}).")
    collection: CollectionKey
    status: ReviewStatus
    tier: ReviewTier = Field(description="high items come first, whatever their priority.")
    trigger: str = Field(description="What queued it: evaluator, feedback, or both joined by '+'.")
    reasons: list[str] = Field(description='Why it is queued, e.g. "faithfulness: 0.42 < 0.80".')
    metrics: list[MetricName] = Field(description="Metrics below their threshold (flagged by the scorer).")
    overall: float | None = Field(description="The answer's overall score; null when nothing could be judged.")
    prompt_name: str | None
    prompt_version: int | None
    held: bool = Field(description="Hold mode: the caller waits for this review.")
    question: str = Field(description="The question as logged (PII masked).")
    traffic: int = Field(description="Queries with the same question in the priority's traffic window.")
    age_s: float = Field(description="Seconds since the item was queued.")
    priority: float = Field(description="Within a tier, higher first: see rag_service.review.priority.")
    claimed_by: uuid.UUID | None = Field(description="The claiming reviewer's key (null: the local operator "
                                                     "or nobody; see status).")
    claimed_at: datetime | None
    lease_expires_at: datetime | None
    created_at: datetime
    decided_at: datetime | None


class ReviewItemsPage(BaseModel):
    data: list[ReviewItemSummary]
    count: int = Field(description="Items matching the filters, on every page.")


class ReviewedAnswer(BaseModel):
    text: str
    short_answer: str | None
    generator: str
    model: str | None
    confidence: float | None


class RetrievedChunk(BaseModel):
    """A passage the generator read ([n] in the answer)."""

    n: int
    chunk_id: uuid.UUID
    score: float | None
    text: str | None = Field(description="Null when the chunk no longer exists (document changed or deleted).")
    document_id: uuid.UUID | None
    source_uri: str | None
    title: str | None


class StoredScores(BaseModel):
    """One scorer's grades of an answer, as stored."""

    scorer: str
    overall: float | None
    needs_review: bool
    reasons: list[str]
    metrics: dict[str, MetricValue]
    created_at: datetime


class ReviewDecisionPublic(BaseModel):
    """A reviewer's decision on an item (one per item)."""

    review_id: uuid.UUID
    decision: DecisionKind
    category: ReviewCategory
    feedback: str | None
    corrected_answer: str | None
    corrected_routing: dict[str, Any] | None
    corrected_prompt: str | None
    time_to_review_s: float | None
    reviewer_key_id: uuid.UUID | None = Field(description="null: the local operator.")
    prompt_name: str | None
    prompt_version: int | None
    created_at: datetime
    golden_item_id: uuid.UUID | None = Field(description="The golden item an approved or edited answer became.")
    candidate_prompt_version: int | None = Field(default=None, description=(
        "The candidate version of the answer's prompt that corrected_prompt created (label candidate)."))
    candidate_guidelines_version: int | None = Field(default=None, description=(
        "The candidate guidelines version that corrected_routing created (label candidate)."))


class ReviewItemDetail(ReviewItemSummary):
    """Everything a reviewer needs to judge the answer."""

    resolved_question: str | None = Field(description="The question with references to earlier turns resolved.")
    answer: ReviewedAnswer
    citations: list[Citation] = Field(description="With the quoted span's offsets in its document.")
    context: list[RetrievedChunk] = Field(description="The passages the generator read, in [n] order.")
    intent: dict[str, Any]
    route: dict[str, Any]
    scores: list[StoredScores] = Field(description="Each scorer's metrics with their reasons.")
    decision: ReviewDecisionPublic | None


class ReviewClaim(BaseModel):
    """A reviewer's lease on an item: nobody else can claim or decide it until it expires."""

    review_id: uuid.UUID
    claimed_by: uuid.UUID | None = Field(description="null: the local operator.")
    claimed_at: datetime
    lease_expires_at: datetime


class ReviewDecisionRequest(BaseModel):
    """A decision on a claimed item."""

    model_config = ConfigDict(extra="forbid")

    decision: DecisionKind = Field(description="approved (the answer stands), rejected, or edited (with "
                                               "corrected_answer).")
    category: ReviewCategory = Field(description="What the review was mostly about.")
    feedback: str | None = Field(default=None, max_length=5_000, description="Free text for the team.")
    corrected_answer: str | None = Field(default=None, max_length=20_000,
                                         description="The answer as it should have been; required for edited.")
    corrected_routing: dict[str, Any] | None = Field(default=None,
                                                     description='The route it should have taken, e.g. '
                                                                 '{"guideline": "exact-lookup"}.')
    corrected_prompt: str | None = Field(default=None, max_length=20_000,
                                         description="A prompt that would have done better.")
    time_to_review_s: float | None = Field(default=None, ge=0, le=30 * 86_400,
                                           description="Default: seconds since the item was claimed.")

    @model_validator(mode="after")
    def _corrected_answer_iff_edited(self) -> ReviewDecisionRequest:
        has_answer = self.corrected_answer is not None and self.corrected_answer.strip() != ""
        if self.decision == "edited" and not has_answer:
            raise ValueError("corrected_answer is required when decision is edited")
        if self.decision != "edited" and self.corrected_answer is not None:
            raise ValueError("corrected_answer is only taken with decision edited")
        return self


class DecisionCounts(BaseModel):
    approved: int = 0
    rejected: int = 0
    edited: int = 0
    total: int = 0


class PromptDecisions(DecisionCounts):
    prompt_name: str | None
    prompt_version: int | None


class AgePercentiles(BaseModel):
    p50: float = Field(description="Median seconds waited.")
    p95: float


class MetricAgreement(BaseModel):
    """Whether the scorer flagging a metric predicted the reviewer correcting the answer."""

    kappa: float | None = Field(description="Cohen's kappa between 'the metric was flagged' and 'the reviewer "
                                            "rejected or edited'; null when undefined (no items, or both "
                                            "raters constant).")
    n: int = Field(description="Decided items it is computed over.")
    flagged: int = Field(description="Of those, items that flagged the metric.")
    corrected: int = Field(description="Of those, items the reviewer rejected or edited.")


class ReviewStats(BaseModel):
    by_status: dict[ReviewStatus, int] = Field(description="Queue length by state.")
    open_age_s: AgePercentiles | None = Field(
        description="How long open items (pending or claimed) have waited; null when none are open.")
    decisions_by_category: dict[ReviewCategory, DecisionCounts]
    decisions_by_prompt: list[PromptDecisions]
    agreement: dict[MetricName, MetricAgreement] = Field(
        description="Judge-human agreement per metric over decided items (Cohen's kappa).")


LOW_RATING = 2


class FeedbackRequest(BaseModel):
    """A user's rating of an answer. Ratings of 2 or less put the answer in the review queue
    (1: with high priority)."""

    model_config = ConfigDict(extra="forbid")

    rating: int = Field(ge=1, le=5, description="1 (useless or wrong) to 5 (exactly right); <= 2 queues a review.")
    comment: str | None = Field(default=None, max_length=2_000, description="What was wrong or right.")


class FeedbackReceipt(BaseModel):
    feedback_id: int
    answer_id: uuid.UUID
    rating: int
    review_id: uuid.UUID | None = Field(description="The review item the feedback queued or joined (low ratings).")


AnswerStatus = Literal["answered", "pending_review", "reviewed", "rejected", "expired"]


class AnswerView(BaseModel):
    """An answer as its caller may see it. Held answers (review gate in hold mode) show nothing
    of the answer until a reviewer has decided."""

    answer_id: uuid.UUID
    status: AnswerStatus = Field(
        description="answered: delivered as generated; pending_review: held until a reviewer decides; "
                    "reviewed: held and approved (the answer) or edited (the corrected answer); rejected: held "
                    "and rejected (no answer); expired: held and never reviewed (no answer).")
    collection: CollectionKey
    question: str
    answer: str | None
    short_answer: str | None = None
    citations: list[Citation] = Field(default_factory=list)
    scores: list[StoredScores] = Field(default_factory=list, description="The stored grades.")
    review_id: uuid.UUID | None = None
    review_status: ReviewStatus | None = None
    message: str | None = Field(default=None, description="Why there is no answer, or how it was reviewed.")
    created_at: datetime
