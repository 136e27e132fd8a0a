"""POST /v1/query (a cited answer or a clarification), POST /v1/query/stream (the same as
server-sent events while it runs), GET/PUT /v1/guidelines (the router's versioned rules)."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field
from sse_starlette.sse import EventSourceResponse

from rag_service.api.auth import AdminDep, ReaderDep, role, scoped
from rag_service.api.deps import RuntimeDep
from rag_service.api.limits import OVERLOADED
from rag_service.api.problems import problem_body
from rag_service.domain import GuidelineSet, QueryRequest, QueryResult, QueryTrace
from rag_service.domain.prompts import GUIDELINES_NAME
from rag_service.errors import NotFoundError

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1", tags=["query"])


@router.post(
    "/query",
    response_model=QueryResult,
    summary="Ask a question",
    description="Runs the pipeline: input guardrails, intent, routing, retrieval (per question part, concurrently), "
                "generation (chain-of-thought with an LLM when configured, else extractive) with verified citations. "
                "`outcome` is `answered`, `no_answer` (the documents do not appear to hold the answer; "
                "`closest_sources` lists the nearest passages), `clarification` (see `clarification.questions`), "
                "`declined`, or `pending_review` (review gate in hold mode).",
    responses={404: {"description": "The collection does not exist"},
               422: {"description": "Malformed request (the body says which field and why)"}, **OVERLOADED},
    **role("reader"),
)
async def query(body: QueryRequest, runtime: RuntimeDep, caller: ReaderDep) -> QueryResult:
    return await runtime.pipeline.run(scoped(caller, body), api_key_id=caller.key_id)


@router.post(
    "/query/stream",
    summary="Ask a question, with progress as server-sent events",
    description="Events: `plan`, `step.start`, `step.end`, `intent`, `route`, `retrieval`, `token` (answer text as "
                "it is written), `token.reset` (discard the tokens so far: the answer was replaced by the fallback), "
                "`citation`, then `done` (the full result, as POST /v1/query returns it; authoritative) or `error` "
                "(`{status, title, detail, step}`; `step` names the plan step that failed, when one did). "
                "Each event's data is JSON.",
    response_class=EventSourceResponse,
    responses={200: {"content": {"text/event-stream": {}}}, **OVERLOADED},
    **role("reader"),
)
async def query_stream(body: QueryRequest, runtime: RuntimeDep, caller: ReaderDep) -> EventSourceResponse:
    body = scoped(caller, body)  # before the stream starts: a scope error is a plain 403
    events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

    async def emit(kind: str, data: dict[str, Any]) -> None:
        await events.put({"event": kind, "data": json.dumps(data, default=str)})

    async def run() -> None:
        try:
            result = await runtime.pipeline.run(body, emit, api_key_id=caller.key_id)
            await emit("done", result.model_dump(mode="json"))
        except Exception as exc:  # the stream must end with an event, never a dropped connection
            await emit("error", problem_body(exc))
        finally:
            await events.put(None)

    async def stream() -> AsyncIterator[dict[str, Any]]:
        task = asyncio.create_task(run())
        try:
            while (item := await events.get()) is not None:
                yield item
        finally:
            if not task.done():
                task.cancel()

    return EventSourceResponse(stream(), ping=15)


class GuidelinesPublic(BaseModel):
    version: int
    guidelines: GuidelineSet


class GuidelinesUpdate(BaseModel):
    guidelines: GuidelineSet
    comment: str | None = Field(default=None, max_length=2000)


@router.get("/guidelines", response_model=GuidelinesPublic, summary="The router's current guidelines",
            **role("reader", operator=True))
async def get_guidelines(runtime: RuntimeDep) -> GuidelinesPublic:
    version, guidelines = await runtime.guidelines.current()
    return GuidelinesPublic(version=version, guidelines=guidelines)


@router.put("/guidelines", response_model=GuidelinesPublic, summary="Store a new version of the guidelines",
            description="Validated as a whole (unique names, known query types and strategies, valid regexes); "
                        "the new version takes effect at once in this process and within seconds in others. "
                        "The version records the key that stored it. Refused (409) while "
                        "RAGSVC_PROMOTION_REQUIRES_EVAL_RUN is set: then new guidelines go through "
                        "`/v1/guidelines/versions` and an eval run.",
            responses={409: {"description": "The offline promotion gate is required"},
                       422: {"description": "Invalid guidelines (the body says what to fix)"}},
            **role("admin", operator=True))
async def put_guidelines(body: GuidelinesUpdate, runtime: RuntimeDep, caller: AdminDep) -> GuidelinesPublic:
    runtime.prompts.refuse_ungated_production("guidelines", GUIDELINES_NAME, "new guidelines")
    version = await runtime.guidelines.put(body.guidelines, body.comment, author=caller.label)
    return GuidelinesPublic(version=version, guidelines=body.guidelines)


@router.get("/queries/{query_id}/trace", response_model=QueryTrace, summary="How a query was answered",
            description="The stored trace of a query: each step with its status and time, the route (with the "
                        "guideline that matched), the passages the answer was written from with each strategy's "
                        "rank, what failed or fell back and why, the generator and prompt version, tokens, and the "
                        "evaluation. The question is PII-masked. A reader key sees the traces of its own queries; "
                        "reviewers and admins see all within their collections and principals. Kept for "
                        "RAGSVC_TRACE_RETENTION_DAYS.",
            responses={404: {"description": "No such trace (unknown, someone else's, past retention, or not yet "
                                            "stored: a trace is written just after its answer, and a replica "
                                            "other than the one that answered does not wait for it)"}},
            **role("reader"))
async def query_trace(query_id: uuid.UUID, runtime: RuntimeDep, caller: ReaderDep) -> QueryTrace:
    trace = await runtime.query_trace(query_id)
    own = caller.local or trace.api_key_id == caller.key_id
    # Not this key's to read: 404, as for an unknown id (a 403 would confirm the query exists).
    if (not own and not caller.can("reviewer")) or not caller.scope.covers(trace.collection) \
            or caller.principals_not_held(trace.principals):
        raise NotFoundError(f"no trace of query {query_id} for this key (a reader key sees its own queries' "
                            "traces; a key sees none of another collection or of principals it does not hold)")
    return trace
