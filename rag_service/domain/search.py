"""The search API's request and response (shared by HTTP and the CLI).

The request never carries ``acl_bypass``: callers see public documents and those shared with the
principals they name. Over HTTP those are narrowed to the API key's (``rag_service.api.auth.scoped``).
"""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rag_service.domain.documents import COLLECTION_PATTERN
from rag_service.domain.query import SearchFilters
from rag_service.domain.retrieval import MAX_QUERY_CHARS, MAX_TOP_K, Iteration, RerankReport
from rag_service.domain.strategies import StrategyName
from rag_service.domain.tenants import CollectionKey


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS)
    collection: CollectionKey = Field(default="default", pattern=COLLECTION_PATTERN)
    strategies: list[StrategyName] | None = Field(
        default=None, min_length=1, description="Default: the service's configured strategies."
    )
    filters: SearchFilters | None = None
    top_k: int = Field(default=10, ge=1, le=MAX_TOP_K)
    rerank: bool | None = Field(default=None, description="Default: on when a reranker is configured.")
    adaptive: bool | None = Field(default=None, description="Run the adaptive loop when confidence is low.")
    expand_parents: bool = Field(default=False, description="Attach each hit's parent chunk (hierarchical chunking).")
    principals: list[str] = Field(
        default_factory=list, max_length=100,
        description="The caller's principals: documents with an ACL are visible only to a named principal.",
    )


class SearchResultPublic(BaseModel):
    rank: int
    chunk_id: uuid.UUID
    document_id: uuid.UUID
    source_uri: str
    title: str | None
    text: str
    start_char: int
    end_char: int
    score: float = Field(description="The final ordering score: the reranker's when it ran, else the fused score.")
    fused_score: float
    rerank_score: float | None
    ranks: dict[str, int] = Field(description="1-based rank of this chunk in each strategy that found it.")
    strategy_scores: dict[str, float] = Field(description="Each strategy's own score (cosine, BM25, ...).")
    metadata: dict[str, Any]
    parent_text: str | None = None


class SearchResponse(BaseModel):
    query: str
    collection: CollectionKey
    results: list[SearchResultPublic]
    confidence: float | None = Field(description="From the fused scores, 0-1; null when nothing could judge them.")
    iterations: list[Iteration]
    rerank: RerankReport | None
    elapsed_ms: float
