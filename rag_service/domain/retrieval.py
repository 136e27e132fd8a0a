"""What a retrieval is asked and what it returns: fused candidates with their per-strategy ranks,
and a record of every iteration of the adaptive loop (the trace)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from rag_service.domain.documents import SearchFilter, SearchHit
from rag_service.domain.strategies import StrategyName, strategy_names

MAX_QUERY_CHARS = 2000
MAX_TOP_K = 100


class RetrievalRequest(BaseModel):
    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS)
    filter: SearchFilter = Field(default_factory=SearchFilter)
    top_k: int = Field(default=10, ge=1, le=MAX_TOP_K)
    strategies: tuple[StrategyName, ...] | None = None
    rerank: bool | None = None
    adaptive: bool | None = None
    expand_parents: bool = False
    candidates: int | None = Field(default=None, ge=1, le=1000,
                                   description="Depth of each strategy's list (default: the configured one).")
    relax_filters: Literal["when_few", "when_empty", "never"] = Field(
        default="when_few", description="When the adaptive loop may drop structured filters: when they leave "
                                        "fewer than top_k results, only when they leave none, or never.")

    @field_validator("query")
    @classmethod
    def _has_words(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("query must contain some text")
        return value

    @field_validator("strategies")
    @classmethod
    def _distinct(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None and not value:
            raise ValueError(f"strategies must name at least one of {', '.join(strategy_names())}")
        return tuple(dict.fromkeys(value)) if value else value


class Candidate(BaseModel):
    """A chunk after fusion: the stored hit plus where each strategy ranked it."""

    hit: SearchHit
    fused_score: float
    ranks: dict[str, int] = Field(default_factory=dict, description="Best 1-based rank per strategy.")
    scores: dict[str, float] = Field(default_factory=dict, description="That strategy's own score.")
    rerank_score: float | None = None
    parent_text: str | None = Field(default=None, description="The parent chunk, when parents are expanded.")


class StrategyReport(BaseModel):
    """What one strategy did in one iteration."""

    strategy: str
    query: str
    hits: int
    elapsed_ms: float
    error: str | None = None
    detail: dict[str, Any] = Field(default_factory=dict)


class RerankReport(BaseModel):
    reranker: str
    applied: bool
    candidates: int = 0
    elapsed_ms: float = 0.0
    error: str | None = None


class Iteration(BaseModel):
    """One thought -> action -> observation step of the adaptive loop, kept for the trace."""

    number: int
    thought: str
    action: str
    queries: list[str]
    top_k: int
    filter_relaxed: bool = False
    strategies: list[StrategyReport]
    results: int
    confidence: float | None = Field(description="None: nothing in the results could be judged.")
    elapsed_ms: float


class RetrievalResult(BaseModel):
    candidates: list[Candidate]
    iterations: list[Iteration]
    rerank: RerankReport | None = None
    confidence: float | None
    elapsed_ms: float
