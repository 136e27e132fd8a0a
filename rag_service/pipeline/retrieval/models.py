"""Types passed between the retrieval stages and returned to the API."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from rag_service.domain import SearchHit

StrategyName = Literal["semantic", "keyword", "metadata", "pattern"]
STRATEGY_NAMES: tuple[StrategyName, ...] = ("semantic", "keyword", "metadata", "pattern")


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
