"""The MCP server: the service's tools and resources for agents, on the official SDK's ``MCPServer``.

Each tool is a thin edge, like an HTTP route: it checks the caller's role and its key's scope, then
calls the service function the route calls (``search``, ``QueryPipeline.run``, ``queue_ingestion``,
the catalog). The transports live elsewhere: ``api/mcp_http.py`` (streamable HTTP at /mcp in the
FastAPI app) and ``cli/mcp.py`` (stdio); who a message runs as is ``api/mcp_session.py``'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations
from pydantic import BaseModel, Field, JsonValue

from rag_service import __version__
from rag_service.api.auth import scoped, scoped_collection
from rag_service.api.documents import (
    DocumentsPublic,
    DocumentWithChunks,
    JobAccepted,
    queue_ingestion,
    readable_document,
    readable_documents,
)
from rag_service.api.mcp_session import McpCall, McpState, bind_caller, current, resource_errors, tool_errors
from rag_service.api.uploads import DocumentCreate, batch_of
from rag_service.domain import (
    COLLECTION_PATTERN,
    MAX_QUERY_CHARS,
    MAX_QUESTION_CHARS,
    MAX_TOP_K,
    Citation,
    Clarification,
    CollectionSummary,
    EvaluationReport,
    JobStatus,
    QueryRequest,
    QueryResult,
    SearchFilters,
    SearchRequest,
    SearchResponse,
    StrategyName,
)
from rag_service.domain.query import Outcome
from rag_service.errors import NotFoundError
from rag_service.pipeline.retrieval.search import search as run_search

JOB_POLL_S = 0.25
MAX_WAIT_S = 120.0
INSTRUCTIONS = (
    "A knowledge service over ingested documents. `list_collections` shows what can be asked about; `search` "
    "returns ranked passages with each strategy's rank; `ask` answers with numbered citations [n] to exact "
    "passages, a confidence and seven quality scores (an `outcome` other than `answered` means no answer: say so "
    "rather than guess); `ingest_text` adds or replaces a document. Documents are readable as resources: "
    "ragsvc://collections, ragsvc://collections/{name}/documents and ragsvc://documents/{id}.")

Collection = Annotated[str, Field(pattern=COLLECTION_PATTERN, description="The collection (see list_collections).")]
Principals = Annotated[list[str] | None, Field(
    max_length=100, description="Read as only these ACL principals (the key must hold them); default: all the key "
                                "holds. Documents without an ACL are visible to everyone.")]
Filters = Annotated[SearchFilters | None, Field(description="Constraints on the documents (all must hold).")]


# --- outputs ------------------------------------------------------------------------------------

class AskAnswer(BaseModel):
    """What an agent needs of a query result (POST /v1/query's full result, and the stored trace
    under ``query_id``, have the rest: intent, route, steps, timings)."""

    query_id: uuid.UUID
    outcome: Outcome = Field(description="answered | no_answer (the documents do not appear to hold the answer) | "
                                         "clarification | declined | pending_review (held for a reviewer)")
    answer: str | None = Field(description="The answer, with [n] markers that refer to `citations`.")
    short_answer: str | None
    citations: list[Citation] = Field(description="[n] -> the chunk, its document and source, and the quoted span.")
    confidence: float | None
    evaluation: EvaluationReport | None = Field(description="The seven quality scores and the weighted overall.")
    clarification: Clarification | None
    closest_sources: list[Citation] = Field(description="Outcome no_answer: the nearest passages (not support).")
    conversation_id: str | None
    review_id: uuid.UUID | None = Field(description="The review item, when the answer was queued for review.")

    @classmethod
    def of(cls, result: QueryResult) -> AskAnswer:
        return cls(**{name: getattr(result, name) for name in cls.model_fields})


class IngestOutcome(JobAccepted):
    """The ingestion job, and how it ended when the call waited for it."""

    status: JobStatus
    report: dict[str, Any] | None = Field(default=None, description="Counts and errors, once finished.")
    error: str | None = None
    document_id: uuid.UUID | None = Field(default=None, description="Once succeeded: the document, readable as "
                                                                    "ragsvc://documents/{document_id}.")


class CollectionsPublic(BaseModel):
    data: list[CollectionSummary]
    count: int


# --- tools --------------------------------------------------------------------------------------

@tool_errors
async def search(
    query: Annotated[str, Field(min_length=1, max_length=MAX_QUERY_CHARS,
                                description="What to look for: words, an identifier, a quoted phrase.")],
    collection: Collection = "default",
    top_k: Annotated[int, Field(ge=1, le=MAX_TOP_K, description="How many passages to return.")] = 10,
    strategies: Annotated[list[StrategyName] | None, Field(
        min_length=1, description="Retrieval strategies to run; default: the service's configured set.")] = None,
    filters: Filters = None,
    principals: Principals = None,
) -> SearchResponse:
    """Multi-strategy retrieval over a collection: semantic, keyword (BM25), metadata and pattern search
    run concurrently, are fused by reciprocal rank and reranked. Each result has its chunk and document
    ids, source, text, score and its rank in every strategy that found it."""
    call = current()
    caller = call.require("reader")
    request = SearchRequest(query=query, collection=collection, top_k=top_k, strategies=strategies,
                            filters=filters, principals=principals or [])
    return await run_search(call.runtime.retriever, call.runtime.catalog, scoped(caller, request))


@tool_errors
async def ask(
    question: Annotated[str, Field(min_length=1, max_length=MAX_QUESTION_CHARS, description="The question.")],
    collection: Collection = "default",
    conversation_id: Annotated[str | None, Field(
        min_length=1, max_length=200, pattern=r"^[\w.:-]+$",
        description="Follow-ups with the same id may refer to earlier questions in it.")] = None,
    filters: Filters = None,
    principals: Principals = None,
) -> AskAnswer:
    """Answer a question from a collection's documents: the full query pipeline (guardrails, intent,
    routing, retrieval, generation with verified citations, evaluation). Returns the answer with
    numbered citations (chunk, document, source, quoted span), the outcome and confidence, and the
    seven quality scores (faithfulness, relevance, correctness, coverage, consistency, freshness,
    traceability) with the overall score."""
    call = current()
    caller = call.require("reader")
    request = QueryRequest(question=question, collection=collection, conversation_id=conversation_id,
                           filters=filters, principals=principals or [])
    return AskAnswer.of(await call.runtime.pipeline.run(scoped(caller, request), api_key_id=caller.key_id))


@tool_errors
async def ingest_text(
    text: Annotated[str, Field(min_length=1, description="The document text (Markdown when source_uri ends in .md).")],
    source_uri: Annotated[str, Field(min_length=1, max_length=2000, description=(
        "The document's unique name in the collection; sending the same one again replaces the document."))],
    collection: Collection = "default",
    title: Annotated[str | None, Field(max_length=1000)] = None,
    metadata: Annotated[dict[str, JsonValue] | None, Field(description="Searchable with `filters`.")] = None,
    tags: Annotated[list[str] | None, Field(max_length=100)] = None,
    lob: Annotated[str | None, Field(max_length=200, description="Line of business.")] = None,
    acl: Annotated[list[str] | None, Field(max_length=100, description=(
        "Principals allowed to read it; empty: everyone."))] = None,
    wait_s: Annotated[float, Field(ge=0, le=MAX_WAIT_S, description=(
        "Wait up to this many seconds for the job to finish; 0 returns as soon as it is queued."))] = 0,
) -> IngestOutcome:
    """Ingest a text document into a collection, as POST /v1/documents does: queue an ingestion job
    (chunking and embedding run in a worker) and return its id and status; with `wait_s`, wait for it
    and return the outcome and the document id. Needs a key with the ingester role."""
    call = current()
    caller = call.require("ingester")
    document = DocumentCreate(text=text, source_uri=source_uri, collection=collection, title=title,
                              metadata=metadata or {}, tags=tags or [], lob=lob, acl=acl or [])
    batch = batch_of([document], call.runtime.settings.ingest_max_file_bytes)
    accepted = await queue_ingestion(call.runtime, call.queue, caller, batch)
    if wait_s <= 0:
        return IngestOutcome(**accepted.model_dump())
    return await _wait_for(call, accepted, document, time.monotonic() + wait_s)


async def _wait_for(call: McpCall, accepted: JobAccepted, document: DocumentCreate, deadline: float) -> IngestOutcome:
    jobs = call.runtime.jobs
    job = await jobs.get(accepted.job_id)
    while job.status not in ("succeeded", "failed") and time.monotonic() < deadline:
        await asyncio.sleep(JOB_POLL_S)
        job = await jobs.get(accepted.job_id)
    document_id = None
    if job.status == "succeeded":
        stored = await call.runtime.catalog.states(job.collection, [document.source_uri])
        document_id = stored[document.source_uri].id if document.source_uri in stored else None
    return IngestOutcome(job_id=job.id, status=job.status, status_url=accepted.status_url, report=job.report,
                         error=job.error, document_id=document_id)


@tool_errors
async def list_collections() -> CollectionsPublic:
    """The collections this key may use, with how many documents in each it may read."""
    return await _collections(current())


async def _collections(call: McpCall) -> CollectionsPublic:
    caller = call.require("reader")
    found = await call.runtime.catalog.collections(caller.principals, scope=caller.scope)
    return CollectionsPublic(data=found, count=len(found))


# --- resources ----------------------------------------------------------------------------------

@resource_errors
async def collections_resource() -> CollectionsPublic:
    return await _collections(current())


class _Page(BaseModel):
    limit: int = Field(default=50, ge=1, le=500)
    offset: int = Field(default=0, ge=0)


@resource_errors
async def collection_documents(name: str, limit: str = "50", offset: str = "0") -> DocumentsPublic:
    # Parameters arrive as URI text; validated here so that a bad one is the caller's error, not a crash.
    page = _Page(limit=limit, offset=offset)  # type: ignore[arg-type]
    call = current()
    caller = call.require("reader")
    key = scoped_collection(caller, name)  # first: a scoped key learns nothing of collections outside its scope
    if not await call.runtime.catalog.collection_exists(key):
        raise NotFoundError(f"collection {name!r} does not exist; see ragsvc://collections")
    return await readable_documents(call.runtime, caller, name, limit=page.limit, offset=page.offset)


@resource_errors
async def document(document_id: str) -> DocumentWithChunks:
    call = current()
    caller = call.require("reader")
    try:
        parsed = uuid.UUID(document_id)
    except ValueError:
        raise NotFoundError(f"no document {document_id!r}: document ids are UUIDs") from None
    return await readable_document(call.runtime, caller, parsed)


# --- the server ---------------------------------------------------------------------------------

McpLifespan = Callable[[MCPServer[McpState]], AbstractAsyncContextManager[McpState]]


def build_server(lifespan: McpLifespan) -> MCPServer[McpState]:
    """The server with its tools and resources; ``lifespan`` yields what they run against (the
    transport decides: the HTTP app's runtime, or one opened for stdio)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    server: MCPServer[McpState] = MCPServer(
        "rag-service", title="rag-service", version=__version__, instructions=INSTRUCTIONS, lifespan=lifespan,
        middleware=[bind_caller])
    # MCPServer() calls logging.basicConfig (a rich handler on the root logger) when the root has no
    # handler yet; this service's logging (JSON lines or text, redacted, on stderr) is its own.
    for added in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(added)
    root.setLevel(level)

    reading = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    server.add_tool(search, title="Search a collection", annotations=reading)
    server.add_tool(ask, title="Ask a question", annotations=reading)
    server.add_tool(ingest_text, title="Ingest a text document", annotations=ToolAnnotations(
        read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False))
    server.add_tool(list_collections, title="List collections", annotations=reading)

    server.resource("ragsvc://collections", name="collections", title="Collections", mime_type="application/json",
                    description="The collections this key may use, with how many documents in each it may read.",
                    )(collections_resource)
    server.resource("ragsvc://collections/{name}/documents{?limit,offset}", name="collection-documents",
                    title="Documents of a collection", mime_type="application/json",
                    description="A page of the collection's documents the key may read, most recently updated "
                                "first (limit 1-500, default 50; offset).")(collection_documents)
    server.resource("ragsvc://documents/{document_id}", name="document", title="A document and its chunks",
                    mime_type="application/json",
                    description="The document's metadata and its chunks with their offsets in its text.")(document)
    return server
