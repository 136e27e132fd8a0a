"""``ragsvc mcp``: the MCP server over stdio, for an agent or editor that starts it as a subprocess."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from rag_service.cli.common import app, handle_errors, run_with_runtime, settings

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

    from rag_service.api.mcp_session import McpState
    from rag_service.runtime import Runtime


@app.command("mcp")
@handle_errors
def mcp_command() -> None:
    """Serve the MCP tools and resources over stdio, for an agent that starts this command.

    Tools: search, ask, ingest_text, list_collections. Resources: ragsvc://collections,
    ragsvc://collections/{name}/documents, ragsvc://documents/{id}.

    stdin and stdout carry the protocol; logs go to stderr. Give the MCP client the API's RAGSVC_*
    environment (RAGSVC_DATABASE_URL, or the embedded database under RAGSVC_DATA_DIR).

    It runs as the local admin, like every ragsvc command: whoever can start it reaches the
    database anyway. Over HTTP the same server is at /mcp of `ragsvc serve`, behind API keys.
    Ingestion jobs run in this process where `serve` would run them (RAGSVC_SERVE_WORKER),
    else in `ragsvc worker`."""
    from rag_service.api.auth import LOCAL_ADMIN
    from rag_service.api.lifecycle import serving
    from rag_service.api.mcp_server import build_server
    from rag_service.api.mcp_session import McpState
    from rag_service.providers.embeddings import make_embedder

    # Fail here, as one clear line on stderr, rather than with a traceback from the protocol's
    # start-up: the database (started, when embedded), its schema, the embedder's settings.
    async def reachable(_: Runtime) -> None:
        return None

    run_with_runtime(reachable, check_schema=True)
    config = settings(long_running=True)  # after: the check set up the commands' logging, not the server's
    make_embedder(config)

    @asynccontextmanager
    async def lifespan(_: MCPServer[McpState]) -> AsyncIterator[McpState]:
        async with serving(config) as services:
            yield McpState(services, local_caller=LOCAL_ADMIN)

    # The SDK's stdio transport points fd 1 at stderr while it serves, so nothing but protocol
    # messages (not a stray print, not a native library's output) reaches the client.
    build_server(lifespan).run("stdio")
