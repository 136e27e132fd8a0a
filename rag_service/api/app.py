"""FastAPI app factory. Routes stay thin; errors are translated to problem bodies here, once."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from rag_service import __version__
from rag_service.api import (
    documents,
    eval_runs,
    evaluate,
    health,
    mcp_http,
    monitoring,
    prompts,
    query,
    reviews,
    search,
)
from rag_service.api.auth import REQUIRED_ROLE
from rag_service.api.lifecycle import serving
from rag_service.api.limits import InFlight, InFlightBound, KeyRateLimit
from rag_service.api.problems import document_problems, problem, problem_response
from rag_service.config import Settings, get_settings
from rag_service.errors import RagServiceError
from rag_service.observability.logs import REQUEST_ID_HEADER
from rag_service.observability.logs import request_id as current_request_id
from rag_service.web import console

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with serving(settings) as services:
            app.state.runtime, app.state.queue = services.runtime, services.queue
            async with mcp_http.sessions(app, mcp, settings):
                yield

    app = FastAPI(
        title="rag-service",
        version=__version__,
        summary="Ingest documents; answer questions about them with cited, graded answers.",
        description="Send `Authorization: Bearer rsk_...` (`ragsvc keys create`); each /v1 operation names its "
                    "role (`x-required-role`). The same service is an MCP server at `POST /mcp` (streamable HTTP, "
                    "JSON-RPC; the same keys), not listed here: tools `search`, `ask`, `ingest_text`, "
                    "`list_collections`, and resources for collections and documents.",
        lifespan=lifespan,
    )
    app.include_router(health.router)
    app.include_router(documents.router)
    app.include_router(search.router)
    app.include_router(query.router)
    app.include_router(evaluate.router)
    app.include_router(reviews.router)
    app.include_router(prompts.router)
    app.include_router(prompts.experiments_router)
    app.include_router(eval_runs.router)
    app.include_router(monitoring.router)
    app.include_router(console.router)
    mcp = mcp_http.mount(app)
    app.state.rate_limit = KeyRateLimit(settings.rate_limit)
    app.state.inflight = InFlight(settings.max_inflight_queries)
    app.add_middleware(InFlightBound, state=app.state.inflight)
    app.add_middleware(monitoring.RequestMonitor)  # added last: outermost, every log line of the request has the id

    def openapi() -> dict[str, Any]:
        # Bodies read by hand (multipart or JSON on one route) reference schemas FastAPI does not
        # see in any signature; add them so /docs and clients know the shape.
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in documents.BODY_MODELS:
                components[model.__name__] = model.model_json_schema(ref_template="#/components/schemas/{model}")
            document_problems(schema, REQUIRED_ROLE)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi

    @app.exception_handler(RagServiceError)
    async def _service_error(_: Request, exc: RagServiceError) -> JSONResponse:
        return problem_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return problem(exc.status_code, HTTPStatus(exc.status_code).phrase.lower(), exc.detail)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        response = problem(500, "internal error", "an unexpected error occurred; it has been logged")
        # This handler runs outside the request id middleware: give the id here, so the caller can
        # point at the log line.
        rid = current_request_id()
        if rid:
            response.headers[REQUEST_ID_HEADER] = rid
        return response

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"field": ".".join(str(p) for p in err["loc"]), "message": err["msg"]} for err in exc.errors()
        ]
        return problem(422, "invalid input", errors)

    return app
