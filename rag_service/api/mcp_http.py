"""The MCP server over streamable HTTP at ``/mcp`` in the FastAPI app, behind the API's keys.

- **A route, not a mount**: a Starlette ``Route("/mcp")`` whose endpoint is the SDK session
  manager's ASGI handler. A ``Mount`` would answer ``/mcp`` with a redirect to ``/mcp/`` and label
  the request metrics with the sub-app's inner path; as a route, ``RequestMonitor`` gives every
  MCP request its id and times it under the template ``/mcp``. It is not in the OpenAPI document
  (it is JSON-RPC, not REST).
- **Authentication** before the SDK sees the request, exactly as a ``/v1`` route's: ``authenticate``
  from ``api/auth.py`` (a bearer key; keyless local admin on a loopback server with no key), an
  unknown or missing key a 401 (whose body is a JSON-RPC error, as the SDK's transport refuses
  requests, so that MCP clients show why). Every tool and resource then checks its own role
  (``ingest_text`` needs ingester, the rest reader), so a key without the grant gets a tool error
  that names the role it needs rather than a failed connection.
- **Stateless** (``stateless_http``) with JSON responses: no MCP session lives in one process's
  memory, so any API replica behind a load balancer answers any request, like the REST API; none
  of the tools needs a server-to-client request or a stream.
- **The session manager's lifespan** runs inside the app's (Starlette runs no lifespan of a routed
  ASGI app): ``sessions`` is entered by the app's lifespan once the runtime is open, with a new
  manager each time (a manager runs once), so an app can be started more than once (tests do).
- **DNS rebinding**: the SDK's Host/Origin check is on when ``RAGSVC_HOST`` is a loopback literal
  (127.0.0.1, localhost, ::1), as the SDK does for its own servers: a keyless local admin must not
  be reachable from a web page through a rebound domain name.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE
from mcp_types import INVALID_REQUEST, ErrorData, JSONRPCError
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Match, Route
from starlette.types import Receive, Scope, Send

from rag_service.api.auth import authenticate, check_rate
from rag_service.api.lifecycle import Services
from rag_service.api.mcp_server import build_server
from rag_service.api.mcp_session import McpState, describe
from rag_service.api.problems import problem_body
from rag_service.config import Settings
from rag_service.errors import RagServiceError

MCP_PATH = "/mcp"


class _McpRoute(Route):
    """A route that names itself in the scope, as FastAPI's own routes do (its router does not do it
    for others): ``RequestMonitor`` reads the template it labels the request's metrics with there."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child_scope = super().matches(scope)
        if match != Match.NONE:
            child_scope["route"] = self
        return match, child_scope


class _McpEndpoint:
    """ASGI: authenticate the request like a /v1 route, then hand it to the running session manager."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            # "reader" only shapes the 401's message: it is the least any MCP tool needs.
            request.state.caller = await authenticate(request, "reader")
            check_rate(request, request.state.caller)
        except RagServiceError as exc:
            await _refusal(exc)(scope, receive, send)
            return
        await request.app.state.mcp_sessions.handle_request(scope, receive, send)


def _refusal(exc: RagServiceError) -> JSONResponse:
    """The HTTP status (401 with its challenge) and a JSON-RPC error body, as the SDK's transport
    refuses a request: an MCP client shows a JSON-RPC error's message to its user, and would show
    only "Server returned an error response" for a problem body. Its data is the problem body."""
    error = ErrorData(code=INVALID_REQUEST, message=describe(exc), data=problem_body(exc))
    body = JSONRPCError(jsonrpc="2.0", id=None, error=error).model_dump(mode="json", by_alias=True)
    return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))


def mount(app: FastAPI) -> MCPServer[McpState]:
    """Add the /mcp route to ``app``; the app's lifespan must run ``sessions`` with the returned server."""

    @asynccontextmanager
    async def lifespan(_: MCPServer[McpState]) -> AsyncIterator[McpState]:
        # Entered by the session manager inside the app's lifespan, once the runtime is open.
        yield McpState(Services(app.state.runtime, app.state.queue), local_caller=None)

    server = build_server(lifespan)
    # POST only: stateless, there is no session to DELETE and no server-initiated stream to GET (the
    # transport's spec lets a server answer both with 405, which MCP clients expect).
    app.router.routes.append(_McpRoute(MCP_PATH, endpoint=_McpEndpoint(), methods=["POST"]))
    return server


@asynccontextmanager
async def sessions(app: FastAPI, server: MCPServer[McpState], settings: Settings) -> AsyncIterator[None]:
    """Run a session manager for ``server`` while the app serves."""
    server.streamable_http_app(
        stateless_http=True, json_response=True, host=settings.host,
        # A document sent to ingest_text may be as large as an upload; its JSON encoding can be longer.
        max_request_body_size=max(DEFAULT_MAX_REQUEST_BODY_SIZE, 2 * settings.ingest_max_file_bytes))
    manager = server.session_manager
    async with manager.run():
        app.state.mcp_sessions = manager
        try:
            yield
        finally:
            del app.state.mcp_sessions
