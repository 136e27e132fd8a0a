"""A query's stored trace: what ran, how long each step took, what each strategy ranked, what failed,
and how the answer was graded (``GET /v1/queries/{id}/trace``). Everything taken from the question is
PII-masked, as in the query log."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from rag_service.domain.evaluation import EvaluationReport
from rag_service.domain.query import RetrievalSummary, StepRecord
from rag_service.domain.tenants import CollectionKey


class TraceCandidate(BaseModel):
    n: int = Field(description="Position in the context the answer was written from.")
    chunk_id: str
    source_uri: str
    title: str | None = None
    score: float | None = None
    ranks: dict[str, int] = Field(default_factory=dict, description="Rank in each strategy's list that found it.")
    deleted: bool = Field(default=False, description="Its document was deleted after the query.")


class QueryTrace(BaseModel):
    query_id: uuid.UUID
    collection: CollectionKey
    api_key_id: uuid.UUID | None = Field(default=None, exclude=True)  # who asked: readers see their own
    # The principals the query ran with: a key must hold them all to read the trace (its passages may
    # be restricted documents), as for GET /v1/answers/{id}.
    principals: list[str] = Field(default_factory=list, exclude=True)
    question: str = Field(description="PII-masked.")
    outcome: str
    route: dict[str, Any] = Field(description="The route decision, with the guideline that matched.")
    steps: list[StepRecord]
    timings_ms: dict[str, float]
    retrieval: RetrievalSummary | None = None
    candidates: list[TraceCandidate] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list, description="Each failed or fallen-back step, with why.")
    generator: str | None = None
    model: str | None = None
    prompt: dict[str, Any] | None = None
    fallback_reason: str | None = None
    llm_tokens: dict[str, int] | None = None
    evaluation: EvaluationReport | None = None
    created_at: datetime | None = None
