"""Errors as RFC 9457 problem bodies: the one translation from exceptions to what an HTTP caller
(or an SSE stream's ``error`` event) sees."""

from __future__ import annotations

import logging
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from rag_service.errors import RagServiceError

log = logging.getLogger(__name__)

PROBLEM_MEDIA_TYPE = "application/problem+json"


class FieldProblem(BaseModel):
    field: str = Field(description="Where in the request, e.g. `body.question` or `query.limit`.")
    message: str


class Problem(BaseModel):
    """An error (RFC 9457). Some carry more members, e.g. a conflict's `claimed_by`."""

    model_config = ConfigDict(extra="allow")

    title: str
    status: int
    detail: str | list[FieldProblem] = Field(description="What went wrong; for invalid input, one entry per field.")
    step: str | None = Field(default=None, description="The pipeline step that failed, when one did.")


# What every operation behind a role may answer besides its own responses (api/auth.py ``require``).
ROLE_RESPONSES = {
    "401": "No API key, or an unknown, revoked or malformed one (`WWW-Authenticate: Bearer`)",
    "403": "The key's role lacks the grant, or the request reaches outside the key's collections or principals",
    "429": "Over the key's rate (RAGSVC_RATE_LIMIT); see Retry-After",
}


def document_problems(schema: dict[str, Any], role_extension: str) -> None:
    """Document the problem bodies in an OpenAPI document: every error response without its own
    content (or with FastAPI's default validation error, which this app never sends) is a Problem
    in ``application/problem+json``, and every operation behind a role lists ROLE_RESPONSES."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components["Problem"] = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
    components.update(components["Problem"].pop("$defs", {}))
    content = {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}}
    for operation in (op for ops in schema.get("paths", {}).values() for op in ops.values()):
        responses = operation.setdefault("responses", {})
        if role_extension in operation:
            for status, description in ROLE_RESPONSES.items():
                responses.setdefault(status, {"description": description})
        if "422" in responses and responses["422"].get("description") == "Validation Error":
            responses["422"]["description"] = "Invalid input: `detail` lists each field and why"
        for status, response in responses.items():
            documented = response.get("content", {}).get("application/json", {}).get("schema", {})
            if status[0] in "45" and (not response.get("content") or documented.get("$ref", "").endswith(
                    "/HTTPValidationError")):
                response["content"] = content
    if "HTTPValidationError" not in str(schema["paths"]):
        components.pop("HTTPValidationError", None)
        components.pop("ValidationError", None)


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
                        media_type=PROBLEM_MEDIA_TYPE)


def problem_response(exc: BaseException) -> JSONResponse:
    response = problem(**problem_body(exc))
    # A 401 carries its WWW-Authenticate challenge (UnauthorizedError.headers).
    response.headers.update(getattr(exc, "headers", None) or {})
    return response
