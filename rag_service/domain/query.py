"""A question in, a result out: the query API's request and response, the record of each plan
step, and what the query log stores."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rag_service.domain.answers import Citation, Claim
from rag_service.domain.documents import COLLECTION_PATTERN, JsonScalar, MetadataRange
from rag_service.domain.evaluation import EvaluationReport
from rag_service.domain.intent import Intent
from rag_service.domain.retrieval import Iteration
from rag_service.domain.review import ReviewTrigger
from rag_service.domain.routing import RouteDecision
from rag_service.domain.tenants import CollectionKey

MAX_QUESTION_CHARS = 2000
Outcome = Literal["answered", "no_answer", "clarification", "declined", "pending_review"]
StepStatus = Literal["ok", "failed", "fallback", "skipped"]


class SearchFilters(BaseModel):
    """Structured constraints on documents (all must hold)."""

    model_config = ConfigDict(extra="forbid")

    metadata_equals: dict[str, JsonScalar] = Field(default_factory=dict, description='e.g. {"team": "db"}')
    metadata_in: dict[str, list[JsonScalar]] = Field(default_factory=dict, description='e.g. {"year": [2024, 2025]}')
    metadata_range: dict[str, MetadataRange] = Field(default_factory=dict, description='e.g. {"year": {"gte": 2024}}')
    date_from: datetime | None = Field(default=None, description="Document date (effective or updated) on or after.")
    date_to: datetime | None = None
    lob: str | None = Field(default=None, max_length=200, description="Line of business.")
    tags_any: list[str] = Field(default_factory=list, max_length=100, description="Any of these tags.")

    @field_validator("date_from", "date_to")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        """A date without a time zone is taken as UTC (documents' dates are stored with one)."""
        return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


class QueryRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS * 2,
                          description="The question (control characters are removed; 2,000 characters at most).")
    collection: CollectionKey = Field(default="default", pattern=COLLECTION_PATTERN)
    conversation_id: str | None = Field(default=None, min_length=1, max_length=200, pattern=r"^[\w.:-]+$",
                                        description="Follow-ups with the same id resolve references to earlier "
                                                    "turns.")
    filters: SearchFilters | None = None
    principals: list[str] = Field(default_factory=list, max_length=100)


class StepRecord(BaseModel):
    id: str
    kind: str
    status: StepStatus
    elapsed_ms: float
    attempts: int = 1
    detail: str | None = None
    started_ms: float | None = Field(default=None, description="When the step started, in ms after the query did.")


class Clarification(BaseModel):
    questions: list[str]
    missing: list[str]


class RetrievalSummary(BaseModel):
    parts: list[str]
    results: int
    confidence: float | None
    iterations: int
    reranked: bool
    rerank_error: str | None = None
    strategies: list[str]
    loop: list[list[Iteration]] = Field(default_factory=list, description=(
        "Per part (in the order of `parts`): what each iteration of the adaptive loop tried."))


class QueryResult(BaseModel):
    query_id: uuid.UUID
    conversation_id: str | None
    outcome: Outcome
    question: str
    answer: str | None
    short_answer: str | None = None
    citations: list[Citation] = Field(default_factory=list)
    claims: list[Claim] = Field(default_factory=list)
    confidence: float | None = None
    reasoning_steps: list[str] = Field(default_factory=list)
    clarification: Clarification | None = None
    intent: Intent
    route: RouteDecision
    retrieval: RetrievalSummary | None = None
    generator: str | None = None
    model: str | None = None
    prompt: dict[str, Any] | None = None
    fallback_reason: str | None = None
    closest_sources: list[Citation] = Field(default_factory=list, description=(
        "Outcome no_answer: the passages nearest the question, for the user to look at; they do not "
        "support an answer."))
    answerability: dict[str, float] | None = Field(default=None, description=(
        "Extractive answers, and LLM replies that cite nothing: the answerability model's `probability` that "
        "the evidence answers (abstention below RAGSVC_ANSWER_ABSTAIN_BELOW) and the evidence features it read. "
        "`confidence` is a separate model's, calibrated on questions the collection can answer (for an "
        "abstention, this probability)."))
    guardrails: dict[str, Any]
    llm_tokens: dict[str, int] | None = Field(default=None, description=(
        "The LLM tokens the answer took ({prompt, completion}, as the server reported them, failed attempts "
        "included); null without an LLM or when the server reports none."))
    evaluation: EvaluationReport | None = Field(default=None, description="The answer's seven-metric grades.")
    review_id: uuid.UUID | None = Field(default=None, description="The review item, when the answer was queued.")
    steps: list[StepRecord]
    timings_ms: dict[str, float]


class AnswerLogEntry(BaseModel):
    """An answer as stored (PII masked)."""

    text: str
    short: str | None
    citations: list[dict[str, Any]]
    confidence: float | None
    generator: str
    model: str | None
    prompt_name: str | None
    prompt_version: int | None
    experiment_id: uuid.UUID | None = Field(default=None, description="The experiment that chose the prompt version.")
    variant: str | None = None
    experiment_unit: str | None = Field(default=None, description="What the experiment's assignment stuck to.")
    llm_tokens: dict[str, int] | None = None
    timings: dict[str, float]
    context: list[dict[str, Any]] = Field(default_factory=list, description="[{n, chunk_id, score}] read.")
    held: bool = False


class QueryLogEntry(BaseModel):
    """One query as the query log stores it: everything taken from the question is PII-masked."""

    query_id: uuid.UUID
    conversation_id: str | None
    collection: CollectionKey
    principals: list[str]
    question: str
    resolved_question: str | None
    intent: dict[str, Any]
    route: dict[str, Any]
    guardrails: dict[str, Any]
    outcome: Outcome
    answer: AnswerLogEntry | None
    subject: str | None
    question_hash: str | None = None
    evaluation: EvaluationReport | None = None
    review: ReviewTrigger | None = None
    review_id: uuid.UUID | None = None
    api_key_id: uuid.UUID | None = None
