"""GET /metrics in Prometheus' text format, for keys with the ``monitor`` role (and admins); the
middleware every request passes through (its id and its timing)."""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rag_service.api.auth import role
from rag_service.api.deps import RuntimeDep
from rag_service.observability.logs import REQUEST_ID_HEADER, bind_request_id

log = logging.getLogger(__name__)
router = APIRouter(tags=["monitoring"])


@router.get("/metrics", summary="Prometheus metrics of this process",
            description="Request latency per route template, query step latency, outcomes, LLM tokens and cost, "
                        "evaluation score histograms per metric, the quality alert per collection (1 while its last "
                        "10 answers all scored overall below 0.70), and, read from the database when scraped, the "
                        "ingestion jobs and review items by status and the open review items' age "
                        "(`ragsvc_database_up` 0 when that read failed).",
            response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}},
            **role("monitor", operator=True))
async def metrics(runtime: RuntimeDep) -> Response:
    try:
        runtime.metrics.refresh(await runtime.monitoring.queue_figures())
        runtime.metrics.database_up.set(1)
    except Exception:  # the process's own figures still count most when the database is down
        log.warning("metrics: the queue figures could not be read", exc_info=True)
        runtime.metrics.database_up.set(0)
    return Response(runtime.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


class RequestMonitor:
    """ASGI middleware, one layer for both: binds the request id (the caller's ``X-Request-ID`` when it
    is a plain token, else a new one) for the request's logs and the jobs it queues and returns it in
    the response; and times the request (to its last byte, so a stream counts whole) by method, route
    template (not the raw path: ids would make a series per document) and status."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        given = next((value.decode("latin-1") for name, value in scope.get("headers", [])
                      if name.decode("latin-1").lower() == REQUEST_ID_HEADER.lower()), None)
        rid = bind_request_id(given)
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", []),
                                                  (REQUEST_ID_HEADER.lower().encode(), rid.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route: Any = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            runtime = getattr(scope.get("app").state, "runtime", None) if scope.get("app") else None
            if runtime is not None:
                runtime.metrics.observe_request(scope["method"], template, status, time.perf_counter() - started)
