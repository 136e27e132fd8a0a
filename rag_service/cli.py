"""The ``ragsvc`` command. Every command that reports something takes ``--json`` and then prints
exactly one JSON object on stdout; human-readable output and logs go to stderr or the terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from rag_service.config import Settings, get_settings, hide_password
from rag_service.errors import RagServiceError

P = ParamSpec("P")
R = TypeVar("R")

app = typer.Typer(
    name="ragsvc",
    help="rag-service: ingest documents and answer questions about them with cited answers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="Database schema migrations.", no_args_is_help=True)
app.add_typer(db_app, name="db")

stderr = Console(stderr=True)
JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")]


def _settings() -> Settings:
    settings = get_settings()
    logging.basicConfig(
        level=settings.log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if settings.log_level != "DEBUG":
        # Both narrate every step at INFO; their warnings and errors still show.
        for chatty in ("pgserver", "alembic", "procrastinate"):
            logging.getLogger(chatty).setLevel(logging.WARNING)
    return settings


def handle_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Translate service errors into a one-line message and the error's exit code."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except RagServiceError as exc:
            stderr.print(f"[bold red]error[/]: {exc}", highlight=False)
            raise typer.Exit(exc.exit_code) from None

    return wrapper


def emit_json(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload, default=str) + "\n")


@app.command()
@handle_errors
def serve(
    host: Annotated[str | None, typer.Option(help="Interface to bind (default: RAGSVC_HOST, 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: RAGSVC_PORT, 8000).", min=1, max=65535)] = None,
) -> None:
    """Run the HTTP API (OpenAPI docs at /docs). With no RAGSVC_DATABASE_URL it starts the
    embedded PostgreSQL, or shares the one another ragsvc process already runs on the data dir."""
    import uvicorn

    from rag_service.api import create_app
    from rag_service.providers.embeddings import make_embedder
    from rag_service.runtime import database_url

    settings = _settings()
    # Fail here, as one clear line, rather than inside uvicorn's lifespan with a traceback.
    make_embedder(settings)
    database_url(settings)
    # uvicorn shuts down gracefully on SIGTERM/SIGINT, then re-raises the signal under the
    # handlers it found. With the default ones the process would die without running atexit,
    # leaving the embedded PostgreSQL running; these turn a graceful stop into a clean exit.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(0))
    uvicorn.run(
        create_app(settings), host=host or settings.host, port=port or settings.port,
        log_level=settings.log_level.lower(), lifespan="on",
    )


@app.command()
@handle_errors
def status(as_json: JsonFlag = False) -> None:
    """Show the database (URL without password, PostgreSQL and pgvector versions, schema
    revision), the embedding model and the stored counts."""
    from rag_service.runtime import Runtime

    settings = _settings()

    async def collect() -> dict[str, Any]:
        runtime = await asyncio.to_thread(Runtime.open, settings)
        try:
            return await runtime.status()
        finally:
            await runtime.close()

    info = asyncio.run(collect())
    if as_json:
        emit_json(info)
        return
    table = Table(show_header=False, box=None)
    for section in ("database", "embedding", "counts"):
        for key, value in (info.get(section) or {}).items():
            table.add_row(f"{section}.{key}", str(value))
    Console().print(table)


@app.command()
@handle_errors
def ingest(
    paths: Annotated[list[Path], typer.Argument(help="Files and folders (walked recursively).", exists=False)],
    collection: Annotated[str, typer.Option("--collection", "-c", help="Collection to ingest into.")] = "default",
    fmt: Annotated[str, typer.Option("--format", help="auto (by extension) or beir (.jsonl corpus rows).")] = "auto",
    include: Annotated[list[str] | None, typer.Option(help="Only files matching this glob (repeatable).")] = None,
    exclude: Annotated[list[str] | None, typer.Option(help="Skip files matching this glob (repeatable).")] = None,
    tag: Annotated[list[str] | None, typer.Option("--tag", help="Tag every document (repeatable).")] = None,
    lob: Annotated[str | None, typer.Option(help="Line of business of every document.")] = None,
    acl: Annotated[list[str] | None, typer.Option("--acl", help="Principal allowed to read (repeatable).")] = None,
    prune: Annotated[bool, typer.Option(help="Delete documents of the collection not found in PATHS.")] = False,
    queue: Annotated[bool, typer.Option("--queue", help="Hand the work to the workers and print the job id.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Ingest files into a collection: unchanged documents are skipped, changed ones re-embed only
    their changed chunks. Formats: .txt .md .html .pdf .docx, and BEIR .jsonl with --format beir."""
    from ingestion.pipeline import IngestOptions
    from rag_service.errors import InvalidInputError
    from rag_service.runtime import Runtime

    if fmt not in ("auto", "beir"):
        raise InvalidInputError(f"--format must be 'auto' or 'beir', not {fmt!r}")
    settings = _settings()
    options = IngestOptions(
        collection=collection, format=fmt, include=tuple(include or ()), exclude=tuple(exclude or ()),  # type: ignore[arg-type]
        prune=prune, tags=tuple(tag or ()), lob=lob, acl=tuple(acl or ()),
        max_file_bytes=settings.ingest_max_file_bytes, batch_documents=settings.ingest_batch_documents,
    )

    async def run() -> dict[str, Any]:
        runtime = await asyncio.to_thread(Runtime.open, settings)
        try:
            await runtime.check_schema()
            if queue:
                return await _enqueue_paths(runtime, options, paths)
            with _ingest_progress(quiet=as_json) as on_progress:
                report = await runtime.ingestor().ingest_paths(paths, options, on_progress)
            return report.as_dict()
        finally:
            await runtime.close()

    from ingestion.loaders import LoadError

    try:
        result = asyncio.run(run())
    except LoadError as exc:
        raise InvalidInputError(str(exc)) from None
    if as_json:
        emit_json(result)
        return
    if queue:
        stderr.print(f"queued ingestion job {result['job_id']}; follow it with `ragsvc jobs show {result['job_id']}`")
        return
    docs, chunks = result["documents"], result["chunks"]
    stderr.print(
        f"{result['files']} files in {result['seconds']:.1f} s: {docs['added']} added, {docs['updated']} updated, "
        f"{docs['unchanged']} unchanged, {docs['deleted']} deleted, {docs['failed']} failed; "
        f"chunks {chunks['embedded']} embedded, {chunks['reused']} reused"
    )
    for error in result["errors"]:
        stderr.print(f"  [red]failed[/] {error['source']}: {error['error']}", highlight=False)


async def _enqueue_paths(runtime: Any, options: Any, paths: list[Path]) -> dict[str, Any]:
    from ingestion.jobs import JobRepository, enqueue, make_queue, options_to_params
    from ingestion.loaders import walk

    walk(paths)  # fail now on a missing path rather than later in the worker
    params = options_to_params(options, [str(p.resolve()) for p in paths])
    jobs = JobRepository(runtime.db)
    job_id = await jobs.create(options.collection, params)
    queue_app = make_queue(runtime.db.url)
    async with queue_app.open_async():
        await enqueue(queue_app, job_id, jobs)
    return {"job_id": str(job_id), "status": "queued"}


@app.command()
@handle_errors
def worker() -> None:
    """Consume ingestion jobs from the PostgreSQL queue until stopped (SIGTERM/Ctrl-C finish the
    current job first). Run as many as you like, on any machine that reaches the database."""
    from ingestion.jobs import run_worker
    from rag_service.runtime import Runtime

    settings = _settings()

    async def run() -> None:
        runtime = await asyncio.to_thread(Runtime.open, settings)
        try:
            await runtime.check_schema()
            stderr.print(f"worker consuming ingestion jobs from {runtime.db.display_url}")
            await run_worker(runtime, heartbeat_s=settings.worker_heartbeat_s,
                             stalled_after_s=settings.job_stalled_after_s)
        finally:
            await runtime.close()

    asyncio.run(run())


def _validated(build: Callable[[], R]) -> R:
    """Build a request model from options; a validation error becomes one line naming the field."""
    from pydantic import ValidationError

    from rag_service.errors import InvalidInputError

    try:
        return build()
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'input'}: {e['msg']}" for e in exc.errors())
        raise InvalidInputError(problems) from None


def _with_runtime(work: Callable[[Any], Any]) -> dict[str, Any]:
    """Open a Runtime, await ``work(runtime)`` (a pydantic model), close; the model as JSON data."""
    from rag_service.runtime import Runtime

    settings = _settings()

    async def run() -> dict[str, Any]:
        runtime = await asyncio.to_thread(Runtime.open, settings)
        try:
            return (await work(runtime)).model_dump(mode="json")
        finally:
            await runtime.close()

    return asyncio.run(run())


@app.command()
@handle_errors
def search(
    query: Annotated[str, typer.Argument(help="What to look for (quote it).")],
    collection: Annotated[str, typer.Option("--collection", "-c", help="Collection to search.")] = "default",
    top_k: Annotated[int, typer.Option("--top-k", "-k", help="Results to return.", min=1, max=100)] = 10,
    strategy: Annotated[list[str] | None, typer.Option(
        help="semantic, keyword, metadata or pattern (repeatable; default: the configured set).")] = None,
    tag: Annotated[list[str] | None, typer.Option(help="Only documents with any of these tags (repeatable).")] = None,
    lob: Annotated[str | None, typer.Option(help="Only documents of this line of business.")] = None,
    principal: Annotated[list[str] | None, typer.Option(
        help="Caller principal for documents with an ACL (repeatable).")] = None,
    rerank: Annotated[bool | None, typer.Option("--rerank/--no-rerank", help="Default: as configured.")] = None,
    adaptive: Annotated[bool | None, typer.Option("--adaptive/--no-adaptive",
                                                  help="Default: as configured.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Search a collection: strategies run concurrently, are fused (RRF) and reranked. Shows each
    hit's source, score and rank per strategy; --json adds text, offsets and the loop's iterations."""
    from rag_service.pipeline.retrieval.search import SearchFilters, SearchRequest
    from rag_service.pipeline.retrieval.search import search as run_search

    request = _validated(lambda: SearchRequest(
        query=query, collection=collection, top_k=top_k, strategies=strategy or None,
        filters=SearchFilters(tags_any=tag or [], lob=lob), principals=principal or [],
        rerank=rerank, adaptive=adaptive,
    ))
    result = _with_runtime(lambda runtime: run_search(runtime.retriever, runtime.store, request))
    if as_json:
        emit_json(result)
        return
    confidence = "n/a" if result["confidence"] is None else f"{result['confidence']:.2f}"
    table = Table(title=f"{len(result['results'])} results for {query!r} in {collection} "
                        f"({result['elapsed_ms']:.0f} ms, confidence {confidence})")
    for column in ("#", "score", "source", "ranks", "text"):
        table.add_column(column, overflow="fold" if column == "text" else "ellipsis")
    for hit in result["results"]:
        ranks = " ".join(f"{name}:{rank}" for name, rank in hit["ranks"].items())
        snippet = " ".join(hit["text"].split())[:160]
        table.add_row(str(hit["rank"]), f"{hit['score']:.3f}", Text(hit["source_uri"]), ranks, Text(snippet))
    Console().print(table)
    if result["rerank"] and result["rerank"]["error"]:
        stderr.print(f"[yellow]reranker[/]: {result['rerank']['error']}")


@app.command()
@handle_errors
def ask(
    question: Annotated[str, typer.Argument(help="The question (quote it).")],
    collection: Annotated[str, typer.Option("--collection", "-c", help="Collection to ask about.")] = "default",
    conversation: Annotated[str | None, typer.Option(
        help="Conversation id: follow-ups with the same id may refer to earlier questions.")] = None,
    principal: Annotated[list[str] | None, typer.Option(
        help="Caller principal for documents with an ACL (repeatable).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Ask a question and get an answer with its sources (or the questions to clarify it).
    Without an LLM configured the answer is extractive: the best sentences, cited."""
    from rag_service.pipeline.orchestrator import QueryRequest

    request = _validated(lambda: QueryRequest(question=question, collection=collection,
                                              conversation_id=conversation, principals=principal or []))
    result = _with_runtime(lambda runtime: runtime.pipeline.run(request))
    if as_json:
        emit_json(result)
        return
    console = Console()
    if result["outcome"] == "clarification":
        console.print("[bold]Could you clarify?[/]")
        for item in result["clarification"]["questions"]:
            console.print(Text(f"  - {item}"))
        return
    # Document text is printed as text: a "[/x]" in a source must not be read as Rich markup.
    console.print(result["answer"], markup=False, highlight=False)
    if result.get("short_answer"):
        console.print(Text.assemble(("\nShort answer: ", "bold"), result["short_answer"]))
    if result["citations"]:
        console.print("\n[bold]Sources[/]")
        for c in result["citations"]:
            line = Text(f"  [{c['n']}] {c['title'] or c['source_uri']} ({c['source_uri']}, "
                        f"chars {c['start_char']}-{c['end_char']})")
            if not c["verified"]:
                line.append(" (not verified)", style="yellow")
            console.print(line)
    if result["outcome"] == "answered":
        extra = f"; {result['fallback_reason']}" if result.get("fallback_reason") else ""
        stderr.print(Text(f"{result['generator']} answer, confidence {result['confidence']:.2f}, "
                          f"{result['timings_ms']['total']:.0f} ms{extra}", style="dim"))


jobs_app = typer.Typer(help="Ingestion jobs.", no_args_is_help=True)
app.add_typer(jobs_app, name="jobs")


@jobs_app.command("show")
@handle_errors
def jobs_show(job_id: Annotated[str, typer.Argument(help="Job id printed by `ingest --queue`.")],
              as_json: JsonFlag = False) -> None:
    """Status, progress, counts and per-file errors of one job."""
    import uuid as uuid_module

    from ingestion.jobs import JobRepository
    from rag_service.errors import InvalidInputError
    from rag_service.runtime import Runtime

    try:
        parsed = uuid_module.UUID(job_id)
    except ValueError:
        raise InvalidInputError(f"{job_id!r} is not a job id (a UUID)") from None
    settings = _settings()

    async def fetch() -> dict[str, Any]:
        runtime = await asyncio.to_thread(Runtime.open, settings)
        try:
            return (await JobRepository(runtime.db).get(parsed)).__dict__
        finally:
            await runtime.close()

    job = asyncio.run(fetch())
    if as_json:
        emit_json(job)
        return
    Console().print_json(json.dumps(job, default=str))


@contextlib.contextmanager
def _ingest_progress(quiet: bool) -> Iterator[Callable[[Any], None] | None]:
    """A rich progress bar on stderr: files, documents, chunks embedded and embeddings per second."""
    if quiet or not stderr.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("ingest"), BarColumn(), MofNCompleteColumn(), TextColumn("files"),
                  TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=stderr) as bar:
        task = bar.add_task("ingest", total=None, detail="")

        def update(p: Any) -> None:
            rate = p.chunks_embedded / p.elapsed_s if p.elapsed_s else 0.0
            bar.update(task, total=p.files_total, completed=p.files_done,
                       detail=f"{p.documents_done} docs, {p.chunks_embedded} embedded ({rate:.0f}/s), "
                              f"{p.chunks_reused} reused")

        yield update


def _migration(action: str, revision: str, as_json: bool) -> None:
    from rag_service.db import migrate
    from rag_service.db.engine import resolve_database_url

    settings = _settings()
    url = resolve_database_url(settings)  # not runtime.database_url: that would upgrade on its own
    current = (migrate.upgrade if action == "upgrade" else migrate.downgrade)(url, settings, revision)
    if as_json:
        emit_json({"action": action, "revision": current, "head": migrate.head_revision(),
                   "database": hide_password(url)})
    else:
        stderr.print(f"{action}: database is now at revision {current or 'none (empty)'}")


@db_app.command("upgrade")
@handle_errors
def db_upgrade(
    revision: Annotated[str, typer.Argument(help="Target revision.")] = "head",
    as_json: JsonFlag = False,
) -> None:
    """Apply migrations up to REVISION (default: the newest)."""
    _migration("upgrade", revision, as_json)


@db_app.command("downgrade")
@handle_errors
def db_downgrade(
    revision: Annotated[str, typer.Argument(help="Target revision: -1 for one step, base for empty.")] = "-1",
    as_json: JsonFlag = False,
) -> None:
    """Revert migrations down to REVISION (default: one step)."""
    _migration("downgrade", revision, as_json)


if __name__ == "__main__":
    app()
