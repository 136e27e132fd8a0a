"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel

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
