"""Who an MCP message runs as and against what, and how service errors reach an MCP client.

Each transport's lifespan yields an ``McpState``. A server middleware (``bind_caller``) resolves
every inbound message's Caller once and binds it, with the state, in a context variable that the
tools and resources read through ``current``: static resources get no SDK Context, so this is
the one way that serves them all alike. Over HTTP the caller is the one ``api/mcp_http.py``
authenticated for the request (on ``request.state.caller``, as the routes' dependency leaves it);
a message without an HTTP request (stdio) runs as the state's ``local_caller``. A message that
has neither is refused: identity is never guessed.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from mcp.server.context import HandlerResult, ServerRequestContext
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from procrastinate import App
from pydantic import ValidationError

from rag_service.api.auth import check_grant
from rag_service.api.lifecycle import Services
from rag_service.domain import Caller, Role
from rag_service.errors import NotFoundError, RagServiceError, UnauthorizedError
from rag_service.runtime import Runtime

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class McpState:
    services: Services
    # Who a message that came without an HTTP request runs as: the local admin over stdio; None
    # over HTTP, where every request must have been authenticated.
    local_caller: Caller | None


@dataclass(frozen=True)
class McpCall:
    state: McpState
    caller: Caller

    @property
    def runtime(self) -> Runtime:
        return self.state.services.runtime

    @property
    def queue(self) -> App:
        return self.state.services.queue

    def require(self, role: Role) -> Caller:
        """The caller, once it may act as ``role`` (else a ForbiddenError naming the role needed)."""
        check_grant(self.caller, role)
        return self.caller


_current: ContextVar[McpCall] = ContextVar("ragsvc_mcp_call")


def current() -> McpCall:
    return _current.get()


async def bind_caller(ctx: ServerRequestContext[Any, Any],
                      call_next: Callable[[ServerRequestContext[Any, Any]], Awaitable[HandlerResult]]) -> HandlerResult:
    """Server middleware: resolve the message's caller and bind it for the handler."""
    state: McpState = ctx.lifespan_context
    request = ctx.request
    caller = state.local_caller if request is None else getattr(request.state, "caller", None)
    if caller is None:
        raise UnauthorizedError("this MCP message was not authenticated; send `Authorization: Bearer <key>`")
    token = _current.set(McpCall(state, caller))
    try:
        return await call_next(ctx)
    finally:
        _current.reset(token)


def describe(exc: RagServiceError | ValidationError) -> str:
    """What the client is told: the error's kind and its message, which says what to fix."""
    if isinstance(exc, ValidationError):
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'input'}: {e['msg']}" for e in exc.errors()[:10])
        return f"invalid input: {problems}"
    where = f" (in step {exc.step})" if exc.step else ""
    return f"{exc.title}{where}: {exc}"


def tool_errors(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """A tool whose service errors (and invalid requests it builds) become a tool error result
    (``isError``) carrying the message, as the HTTP API's problem body would; anything else is a
    bug, which the SDK logs with its traceback and reports without its text."""

    @functools.wraps(fn)
    async def tool(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except (RagServiceError, ValidationError) as exc:
            raise ToolError(describe(exc)) from exc

    return tool


def resource_errors(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """The same for a resource: not found is the protocol's "invalid params" (-32602), any other
    service error an internal error (-32603) with the message."""

    @functools.wraps(fn)
    async def resource(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except NotFoundError as exc:
            raise ResourceNotFoundError(describe(exc)) from exc
        except (RagServiceError, ValidationError) as exc:
            raise ResourceError(describe(exc)) from exc

    return resource
