"""POST /v1/search: multi-strategy retrieval, fused and reranked, with the adaptive loop's trace."""

from __future__ import annotations

from fastapi import APIRouter

from rag_service.api.auth import ReaderDep, role, scoped
from rag_service.api.deps import RuntimeDep
from rag_service.api.limits import OVERLOADED
from rag_service.domain import SearchRequest, SearchResponse
from rag_service.pipeline.retrieval.search import search

router = APIRouter(prefix="/v1", tags=["search"])


@router.post(
    "/search",
    response_model=SearchResponse,
    summary="Search a collection",
    description="Runs the requested strategies (semantic, keyword/BM25, metadata, pattern, and any registered "
                "one) concurrently, fuses them with weighted reciprocal-rank fusion, reranks, and widens or "
                "rewrites the search when its confidence is low. Each result carries its rank in every strategy "
                "that found it; `iterations` records what the adaptive loop tried.",
    responses={404: {"description": "The collection does not exist"},
               422: {"description": "Malformed request (the body says which field and why)"}, **OVERLOADED},
    **role("reader"),
)
async def search_collection(body: SearchRequest, runtime: RuntimeDep, caller: ReaderDep) -> SearchResponse:
    return await search(runtime.retriever, runtime.catalog, scoped(caller, body))
