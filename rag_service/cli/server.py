"""``ragsvc serve``, ``ragsvc worker`` and ``ragsvc status``: running the service and looking at it."""

from __future__ import annotations

import signal
import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from rag_service.cli.common import JsonFlag, app, emit_json, handle_errors, run_with_runtime, settings, stderr


@app.command()
@handle_errors
def serve(
    host: Annotated[str | None, typer.Option(help="Interface to bind (default: RAGSVC_HOST, 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: RAGSVC_PORT, 8000).", min=1, max=65535)] = None,
) -> None:
    """Run the HTTP API (OpenAPI docs at /docs). With no RAGSVC_DATABASE_URL it starts the
    embedded PostgreSQL, or shares the one another ragsvc process already runs on the data dir.
    Requests need an API key (`ragsvc keys create`) once one exists; a non-loopback address is
    refused until one does."""
    import uvicorn

    from rag_service.api import create_app
    from rag_service.api.auth import check_exposure, is_loopback
    from rag_service.providers.embeddings import make_embedder
    from rag_service.runtime import Runtime, database_url

    config = settings(long_running=True)
    if host is not None and host != config.host:
        # The app decides from Settings.host whether keyless requests may run as the local admin.
        config = config.model_copy(update={"host": host})
    # Fail here, as one clear line, rather than inside uvicorn's lifespan with a traceback.
    make_embedder(config)
    database_url(config)
    exposed = not is_loopback(config.host)
    if exposed or config.vector_index == "half":

        async def preflight(runtime: Runtime) -> None:
            """The checks that need the database, on one runtime opened once."""
            if exposed:
                check_exposure(config.host, await runtime.keys.any_active())
            await runtime.store.check_vector_index()  # nothing to check unless RAGSVC_VECTOR_INDEX=half

        run_with_runtime(preflight, check_schema=True)
    # uvicorn shuts down gracefully on SIGTERM/SIGINT, then re-raises the signal under the
    # handlers it found. With the default ones the process would die without running atexit,
    # leaving the embedded PostgreSQL running; these turn a graceful stop into a clean exit.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(0))
    uvicorn.run(
        create_app(config), host=config.host, port=port or config.port,
        # log_config None: uvicorn's records go through our handler (JSON lines, redacted).
        log_level=config.log_level.lower(), lifespan="on", log_config=None,
    )


@app.command()
@handle_errors
def worker() -> None:
    """Consume ingestion jobs and eval runs from the PostgreSQL queue until stopped (SIGTERM/Ctrl-C
    finish the current job first). Run as many as you like, on any machine that reaches the database."""
    from ingestion.jobs import run_worker
    from rag_service.runtime import Runtime

    config = settings(long_running=True)

    async def consume(runtime: Runtime) -> None:
        stderr.print(f"worker consuming ingestion jobs and eval runs from {runtime.db.display_url}")
        await run_worker(runtime.db.url, runtime.job_deps(), also=runtime.other_jobs(),
                         heartbeat_s=config.worker_heartbeat_s,
                         stalled_after_s=config.job_stalled_after_s)

    run_with_runtime(consume, check_schema=True)


@app.command()
@handle_errors
def status(as_json: JsonFlag = False) -> None:
    """Show the database (URL without password, PostgreSQL and pgvector versions, schema
    revision), the embedding model and the stored counts."""
    from rag_service.runtime import Runtime

    async def collect(runtime: Runtime) -> dict[str, Any]:
        return (await runtime.status()).model_dump()

    info = run_with_runtime(collect)
    if as_json:
        emit_json(info)
        return
    table = Table(show_header=False, box=None)
    for section in ("database", "embedding", "counts"):
        for key, value in (info.get(section) or {}).items():
            table.add_row(f"{section}.{key}", str(value))
    Console().print(table)
