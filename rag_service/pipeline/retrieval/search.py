"""The search use case shared by the HTTP API and the CLI: a public request, a public result.

The public request never carries ``acl_bypass``: callers see public documents and those shared
with the principals they name. (Until authentication exists, principals are taken as stated;
run the service behind a gateway that sets them.)
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rag_service.domain import COLLECTION_PATTERN, JsonScalar, MetadataRange, SearchFilter
from rag_service.errors import InvalidInputError, NotFoundError
from rag_service.pipeline.retrieval.models import Iteration, RerankReport, StrategyName
from rag_service.pipeline.retrieval.retriever import MAX_QUERY_CHARS, MAX_TOP_K, RetrievalRequest, Retriever
from rag_service.stores.base import VectorStore


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


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS)
    collection: str = Field(default="default", pattern=COLLECTION_PATTERN)
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
    collection: str
    results: list[SearchResultPublic]
    confidence: float | None = Field(description="From the fused scores, 0-1; null when nothing could judge them.")
    iterations: list[Iteration]
    rerank: RerankReport | None
    elapsed_ms: float


def to_retrieval_request(request: SearchRequest) -> RetrievalRequest:
    filters = request.filters or SearchFilters()
    if any(not p.strip() or p == "*" for p in request.principals):
        raise InvalidInputError("principals must be non-empty names other than '*'")
    try:
        flt = SearchFilter(
            collection=request.collection, principals=tuple(request.principals),
            metadata_equals=filters.metadata_equals, metadata_in=filters.metadata_in,
            metadata_range=filters.metadata_range, date_from=filters.date_from, date_to=filters.date_to,
            lob=filters.lob, tags_any=tuple(filters.tags_any),
        )
    except (ValueError, TypeError) as exc:
        raise InvalidInputError(f"invalid filters: {exc}") from None
    return RetrievalRequest(
        query=request.query, filter=flt, top_k=request.top_k,
        strategies=tuple(request.strategies) if request.strategies else None,
        rerank=request.rerank, adaptive=request.adaptive, expand_parents=request.expand_parents,
    )


async def search(retriever: Retriever, store: VectorStore, request: SearchRequest) -> SearchResponse:
    if not request.query.strip():
        raise InvalidInputError("query must contain some text")
    retrieval_request = to_retrieval_request(request)
    if not await store.collection_exists(request.collection):
        raise NotFoundError(f"collection {request.collection!r} does not exist; ingest documents into it first")
    result = await retriever.retrieve(retrieval_request)
    results = [
        SearchResultPublic(
            rank=i, chunk_id=c.hit.chunk_id, document_id=c.hit.document_id, source_uri=c.hit.source_uri,
            title=c.hit.title, text=c.hit.text, start_char=c.hit.start_char, end_char=c.hit.end_char,
            score=c.rerank_score if c.rerank_score is not None else c.fused_score, fused_score=c.fused_score,
            rerank_score=c.rerank_score, ranks=c.ranks, strategy_scores=c.scores, metadata=c.hit.metadata,
            parent_text=c.parent_text,
        )
        for i, c in enumerate(result.candidates, start=1)
    ]
    return SearchResponse(query=request.query, collection=request.collection, results=results,
                          confidence=result.confidence, iterations=result.iterations, rerank=result.rerank,
                          elapsed_ms=result.elapsed_ms)

