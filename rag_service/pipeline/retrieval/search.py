"""The search use case shared by the HTTP API and the CLI: a public request (domain/search.py)
in, a public result out. The request's scope becomes the SearchFilter every strategy applies."""

from __future__ import annotations

from rag_service.domain import (
    RetrievalRequest,
    SearchFilter,
    SearchFilters,
    SearchRequest,
    SearchResponse,
    SearchResultPublic,
    no_such_collection,
)
from rag_service.errors import InvalidInputError, NotFoundError
from rag_service.pipeline.collaborators import CollectionCatalog, Retrieves


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


async def search(retriever: Retrieves, collections: CollectionCatalog, request: SearchRequest) -> SearchResponse:
    if not request.query.strip():
        raise InvalidInputError("query must contain some text")
    retrieval_request = to_retrieval_request(request)
    if not await collections.collection_exists(request.collection):
        raise NotFoundError(no_such_collection(request.collection))
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

