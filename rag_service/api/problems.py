"""Errors as RFC 9457 problem bodies: the one translation from exceptions to what an HTTP caller
(or an SSE stream's ``error`` event) sees."""

from __future__ import annotations

import logging
from typing import Any

from fastapi.responses import JSONResponse

from rag_service.errors import RagServiceError

log = logging.getLogger(__name__)


def problem_body(exc: BaseException) -> dict[str, Any]:
    """``{title, status, detail}`` (+ ``step`` when a pipeline step failed). Anything that is not
    a service error is a bug: logged with its traceback, shown without it."""
    if isinstance(exc, RagServiceError):
        body: dict[str, Any] = {"title": exc.title, "status": exc.status_code, "detail": str(exc)}
        if exc.step:
            body["step"] = exc.step
        # e.g. a conflict's holder and lease expiry; never overriding the standard members
        body.update({k: v for k, v in getattr(exc, "fields", {}).items() if k not in body})
        return body
    log.error("unexpected error", exc_info=exc)
    return {"title": "internal error", "status": 500, "detail": "an unexpected error occurred; it has been logged"}


def problem(status: int, title: str, detail: object, **extra: object) -> JSONResponse:
    return JSONResponse({"title": title, "status": status, "detail": detail, **extra}, status_code=status,
                        media_type="application/problem+json")


def problem_response(exc: BaseException) -> JSONResponse:
    response = problem(**problem_body(exc))
    # A 401 carries its WWW-Authenticate challenge (UnauthorizedError.headers).
    response.headers.update(getattr(exc, "headers", None) or {})
    return response
