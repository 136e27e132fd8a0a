"""FastAPI app factory. Routes stay thin; errors are translated to problem bodies here, once."""

from __future__ import annotations

import asyncio
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

from ingestion.jobs import make_queue, run_worker
from rag_service import __version__
from rag_service.api import documents, eval_runs, evaluate, health, monitoring, prompts, query, reviews, search
from rag_service.api.problems import problem, problem_response
from rag_service.config import Settings, get_settings
from rag_service.errors import RagServiceError
from rag_service.observability.logs import REQUEST_ID_HEADER
from rag_service.observability.logs import request_id as current_request_id
from rag_service.runtime import Runtime
from rag_service.web import console

log = logging.getLogger(__name__)
TRACE_CLEANUP_EVERY_S = 3600


async def _guard_experiments(runtime: Runtime, every_s: float) -> None:
    """Apply the experiments' guardrail periodically, so a worse candidate is stopped even when
    nobody reads its report."""
    while True:
        await asyncio.sleep(every_s)
        try:
            await runtime.prompts.check_running()
        except Exception:  # the check must keep running for the life of the process
            log.exception("experiment guardrail check failed")


async def _clean_traces(runtime: Runtime, every_s: float) -> None:
    """Delete stored query traces past their retention, at start and then every ``every_s``."""
    while True:
        try:
            deleted = await runtime.traces.delete_older_than(runtime.settings.trace_retention_days)
            if deleted:
                log.info("deleted %d query traces older than %s days", deleted, runtime.settings.trace_retention_days)
        except Exception:  # the cleanup must keep running for the life of the process
            log.exception("query trace cleanup failed")
        await asyncio.sleep(every_s)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = await asyncio.to_thread(Runtime.open, settings)
        app.state.runtime = runtime
        # The model loads in the background: /healthz answers at once, /readyz says "loading".
        background = [asyncio.create_task(runtime.warm_up_embedder())]
        queue = make_queue(runtime.db.url)
        await queue.open_async()
        app.state.queue = queue
        background.append(asyncio.create_task(_clean_traces(runtime, TRACE_CLEANUP_EVERY_S)))
        if settings.experiment_check_s > 0:
            background.append(asyncio.create_task(_guard_experiments(runtime, settings.experiment_check_s)))
        if settings.runs_serve_worker:
            # One command is enough on the embedded defaults: jobs run inside the server.
            background.append(asyncio.create_task(run_worker(
                runtime.db.url, runtime.job_deps(), also=runtime.other_jobs(), heartbeat_s=settings.worker_heartbeat_s,
                stalled_after_s=settings.job_stalled_after_s, install_signal_handlers=False)))
        try:
            yield
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await queue.close_async()
            if "pipeline" in runtime.__dict__:  # late LLM gradings get a moment to store their grades
                await runtime.pipeline.drain(timeout_s=10)
            await runtime.close()

    app = FastAPI(
        title="rag-service",
        version=__version__,
        summary="Ingest documents; answer questions about them with cited, graded answers.",
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
    app.add_middleware(monitoring.RequestMonitor)  # added last: outermost, every log line of the request has the id

    def openapi() -> dict[str, Any]:
        # Bodies read by hand (multipart or JSON on one route) reference schemas FastAPI does not
        # see in any signature; add them so /docs and clients know the shape.
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in documents.BODY_MODELS:
                components[model.__name__] = model.model_json_schema(ref_template="#/components/schemas/{model}")
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
