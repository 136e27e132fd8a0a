"""``ragsvc ingest`` (with a progress bar, or queued for the workers) and ``ragsvc jobs``."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from rag_service.cli.common import (
    JsonFlag,
    app,
    emit_json,
    handle_errors,
    parse_id,
    run_with_runtime,
    settings,
    stderr,
)
from rag_service.errors import InvalidInputError

if TYPE_CHECKING:
    from ingestion.pipeline import IngestOptions, Progress
    from rag_service.runtime import Runtime


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
    from ingestion.loaders import LoadError
    from ingestion.pipeline import IngestOptions

    if fmt not in ("auto", "beir"):
        raise InvalidInputError(f"--format must be 'auto' or 'beir', not {fmt!r}")
    config = settings()
    options = IngestOptions(
        collection=collection, format=fmt, include=tuple(include or ()), exclude=tuple(exclude or ()),  # type: ignore[arg-type]
        prune=prune, tags=tuple(tag or ()), lob=lob, acl=tuple(acl or ()),
        max_file_bytes=config.ingest_max_file_bytes, batch_documents=config.ingest_batch_documents,
    )

    async def run(runtime: Runtime) -> dict[str, Any]:
        if queue:
            return await _enqueue_paths(runtime, options, paths)
        with _ingest_progress(quiet=as_json) as on_progress:
            report = await runtime.ingestor().ingest_paths(paths, options, on_progress)
        return report.as_dict()

    try:
        result = run_with_runtime(run, check_schema=True)
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


async def _enqueue_paths(runtime: Runtime, options: IngestOptions, paths: list[Path]) -> dict[str, Any]:
    from ingestion.jobs import enqueue, make_queue, options_to_params
    from ingestion.loaders import walk

    walk(paths)  # fail now on a missing path rather than later in the worker
    params = options_to_params(options, [str(p.resolve()) for p in paths])
    job_id = await runtime.jobs.create(options.collection, params)
    queue_app = make_queue(runtime.db.url)
    async with queue_app.open_async():
        await enqueue(queue_app, job_id, runtime.jobs)
    return {"job_id": str(job_id), "status": "queued"}


jobs_app = typer.Typer(help="Ingestion jobs.", no_args_is_help=True)
app.add_typer(jobs_app, name="jobs")


@jobs_app.command("show")
@handle_errors
def jobs_show(job_id: Annotated[str, typer.Argument(help="Job id printed by `ingest --queue`.")],
              as_json: JsonFlag = False) -> None:
    """Status, progress, counts and per-file errors of one job."""
    parsed = parse_id(job_id, "a job id")

    async def fetch(runtime: Runtime) -> dict[str, Any]:
        # Dates as str() shows them ("2026-11-22 10:00:00+00:00"), as this command always has.
        return json.loads(json.dumps((await runtime.jobs.get(parsed)).model_dump(), default=str))

    job = run_with_runtime(fetch)
    if as_json:
        emit_json(job)
        return
    Console().print_json(json.dumps(job, default=str))


@contextlib.contextmanager
def _ingest_progress(quiet: bool) -> Iterator[Callable[[Progress], None] | None]:
    """A rich progress bar on stderr: files, documents, chunks embedded and embeddings per second."""
    if quiet or not stderr.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("ingest"), BarColumn(), MofNCompleteColumn(), TextColumn("files"),
                  TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=stderr) as bar:
        task = bar.add_task("ingest", total=None, detail="")

        def update(p: Progress) -> None:
            rate = p.chunks_embedded / p.elapsed_s if p.elapsed_s else 0.0
            bar.update(task, total=p.files_total, completed=p.files_done,
                       detail=f"{p.documents_done} docs, {p.chunks_embedded} embedded ({rate:.0f}/s), "
                              f"{p.chunks_reused} reused")

        yield update
