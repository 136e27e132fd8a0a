"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from rag_service.api.auth import role
from rag_service.api.deps import RuntimeDep

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    ready: bool
    checks: dict[str, str]


@router.get("/healthz", response_model=Health, summary="The process is up")
async def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Readiness,
    summary="The database and embedder are ready",
    responses={503: {"model": Readiness, "description": "Not ready; `checks` says which part and why"}},
)
async def readyz(runtime: RuntimeDep) -> Readiness | JSONResponse:
    ready, checks = await runtime.readiness()
    body = Readiness(ready=ready, checks=checks)
    if not ready:
        return JSONResponse(body.model_dump(), status_code=503)
    return body


class IngestionQueue(BaseModel):
    by_status: dict[str, int] = Field(description="Ingestion jobs by status, across every replica.")
    queued_limit: int = Field(description="RAGSVC_MAX_QUEUED_JOBS: an upload beyond it is a 503.")


class ReviewQueue(BaseModel):
    by_status: dict[str, int]
    open_age_s: dict[str, float | None] = Field(description="p50 and p95 age of the pending and claimed items.")


class QueryLoad(BaseModel):
    in_flight: int = Field(description="Query and search requests this process is serving now.")
    limit: int = Field(description="RAGSVC_MAX_INFLIGHT_QUERIES: one more is a 503.")
    refused: int = Field(description="Requests refused at the bound since this process started.")
    rate_limit: str | None = Field(description="RAGSVC_RATE_LIMIT, per key and process (None: no limit).")


class Queues(BaseModel):
    ingestion: IngestionQueue
    reviews: ReviewQueue
    queries: QueryLoad


@router.get("/v1/health/queues", response_model=Queues, summary="Queue depths and this process's load",
            description="The ingestion and review queues (shared by every replica) and this process's queries in "
                        "flight against their bound: what a load balancer or an operator needs to see backpressure.",
            **role("monitor", operator=True))
async def queues(request: Request, runtime: RuntimeDep) -> Queues:
    figures = await runtime.monitoring.queue_figures()
    inflight = request.app.state.inflight
    return Queues(
        ingestion=IngestionQueue(by_status=dict(figures.jobs_by_status), queued_limit=runtime.settings.max_queued_jobs),
        reviews=ReviewQueue(by_status=dict(figures.reviews_by_status), open_age_s=dict(figures.open_review_age_s)),
        queries=QueryLoad(in_flight=inflight.current, limit=inflight.limit, refused=inflight.refused,
                          rate_limit=runtime.settings.rate_limit))
