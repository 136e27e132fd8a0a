"""Ingestion jobs on a PostgreSQL queue (procrastinate).

A job is a row in ``ingest_jobs`` (what was asked, progress, outcome) plus a procrastinate task
that carries only the job id. Workers (``ragsvc worker``, or the one inside ``ragsvc serve``)
run the task; any worker on any machine can, since uploads are stored in the database.

Crash safety: the pipeline commits batch by batch and skips documents whose content hash is
already stored, so re-running a job continues where the dead one stopped. A job whose worker
stopped sending heartbeats is put back in the queue by :func:`recover_stalled_jobs`, which every
worker runs periodically.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from procrastinate import App, JobContext, PsycopgConnector, signals
from procrastinate import tasks as procrastinate_tasks
from procrastinate.exceptions import ConnectorException
from procrastinate.worker import Worker

from ingestion.loaders import LoadedDocument, LoadError, load_bytes
from ingestion.pipeline import IngestOptions, Ingestor, Progress
from rag_service.db.engine import libpq_conninfo
from rag_service.db.repos import JobRepository
from rag_service.domain import JobView, Upload
from rag_service.errors import RagServiceError
from rag_service.observability.logs import bind_request_id
from rag_service.observability.logs import request_id as current_request_id
from rag_service.observability.trace_tree import TraceExporter, job_trace

log = logging.getLogger(__name__)

TASK_NAME = "ingest"
QUEUE = "ingest"
# Tasks are registered once, on this connector-less template (other job kinds, e.g. eval runs,
# register theirs here too); each database gets a copy through ``with_connector`` (registering a
# blueprint on several apps renames its tasks every time).
TASKS = App(connector=PsycopgConnector())


@dataclass(frozen=True)
class QueueConsumer:
    """Another kind of job a worker runs besides ingestion: its queue and task, and what its task
    finds in procrastinate's context under ``context_key``."""

    queue: str
    task_name: str
    context_key: str
    context: Any


@dataclass(frozen=True)
class JobDeps:
    """What a worker needs to run ingestion jobs (handed to each task through procrastinate's
    context): the job rows, and a fresh Ingestor per job."""

    jobs: JobRepository
    make_ingestor: Callable[[], Ingestor]
    tracer: TraceExporter | None = None  # Langfuse, when its keys are set


def options_to_params(options: IngestOptions, paths: list[str] | None = None) -> dict[str, Any]:
    return {
        "paths": paths, "format": options.format, "include": list(options.include),
        "exclude": list(options.exclude), "prune": options.prune, "tags": list(options.tags), "lob": options.lob,
        "acl": list(options.acl), "max_file_bytes": options.max_file_bytes,
        "batch_documents": options.batch_documents,
    }


def params_to_options(collection: str, params: dict[str, Any]) -> IngestOptions:
    return IngestOptions(
        collection=collection, format=params.get("format", "auto"), include=tuple(params.get("include", ())),
        exclude=tuple(params.get("exclude", ())), prune=bool(params.get("prune")),
        tags=tuple(params.get("tags", ())), lob=params.get("lob"), acl=tuple(params.get("acl", ())),
        max_file_bytes=int(params.get("max_file_bytes", 50 * 1024 * 1024)),
        batch_documents=int(params.get("batch_documents", 64)),
    )


async def run_job(job_id: uuid.UUID, jobs: JobRepository, make_ingestor: Callable[[], Ingestor]) -> JobView:
    """Execute one job in this process (what the worker task does)."""
    job = await jobs.get(job_id)
    await jobs.mark_running(job_id)
    options = params_to_options(job.collection, job.params)
    latest: dict[str, Any] = {}

    def on_progress(p: Progress) -> None:
        latest.update(files_total=p.files_total, files_done=p.files_done, documents_done=p.documents_done,
                      chunks_embedded=p.chunks_embedded, chunks_reused=p.chunks_reused,
                      elapsed_s=round(p.elapsed_s, 2))

    async def flush_progress() -> None:
        written: dict[str, Any] = {}
        while True:
            if latest != written:
                written = dict(latest)
                await jobs.set_progress(job_id, written)
            await asyncio.sleep(0.5)

    flusher = asyncio.create_task(flush_progress())
    try:
        ingestor = make_ingestor()  # inside the try: a part that cannot be built fails the job, visibly
        if job.params.get("paths") is not None:
            report = await ingestor.ingest_paths([Path(p) for p in job.params["paths"]], options, on_progress)
        else:
            documents, failures = [], []
            for upload in await jobs.uploads(job_id):
                try:
                    # Parsing runs in a thread: a long PDF must not stall the worker's heartbeat.
                    loaded = await asyncio.to_thread(load_bytes, upload.content, upload.filename,
                                                     max_bytes=options.max_file_bytes)
                    documents.extend(_as_upload(doc, upload) for doc in loaded)
                except LoadError as exc:
                    failures.append({"source": upload.source_uri, "error": str(exc)})
            report = await ingestor.ingest_documents(documents, options, on_progress)
            report.files += len(failures)
            report.failed += len(failures)
            report.errors.extend(failures)
    except (RagServiceError, LoadError) as exc:
        await jobs.finish(job_id, None, str(exc))
        log.warning("ingestion job %s failed: %s", job_id, exc)
        return await jobs.get(job_id)
    except Exception as exc:
        await jobs.finish(job_id, None, f"internal error: {type(exc).__name__}: {exc}")
        raise
    finally:
        flusher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flusher
    await jobs.set_progress(job_id, latest)
    await jobs.finish(job_id, report.as_dict(), None)
    log.info("ingestion job %s succeeded: %d documents added, %d updated, %d failed", job_id, report.added,
             report.updated, report.failed)
    return await jobs.get(job_id)


def _as_upload(doc: LoadedDocument, upload: Upload) -> LoadedDocument:
    doc.source_uri = upload.source_uri
    if upload.title:
        doc.title = upload.title
    if upload.metadata:
        doc.metadata = {**doc.metadata, **upload.metadata}
    return doc


@TASKS.task(name=TASK_NAME, queue=QUEUE, pass_context=True)
async def ingest_task(context: JobContext, job_id: str, request_id: str | None = None) -> None:
    deps: JobDeps = context.additional_context["ingest"]
    bind_request_id(request_id)  # the id of the request that queued it: its logs carry it too
    try:
        await run_job(uuid.UUID(job_id), deps.jobs, deps.make_ingestor)
    finally:
        if deps.tracer is not None:
            await trace_job(deps.tracer, deps.jobs, uuid.UUID(job_id), request_id)


async def trace_job(tracer: TraceExporter, jobs: JobRepository, job_id: uuid.UUID, request_id: str | None) -> None:
    """The finished (or failed) job as a Langfuse trace; never raises (the job's outcome is stored)."""
    try:
        job = await jobs.get(job_id)
        if job.started_at is None or job.status not in ("succeeded", "failed"):
            return  # interrupted (shutdown, a lost worker): traced when a later attempt ends it
        report = job.report or {}
        tracer.submit(job_trace(
            job.id, kind="ingestion", started_at=job.started_at, ended_at=job.finished_at or datetime.now(UTC),
            status=job.status, error=job.error, request_id=request_id,
            input={"collection": job.collection, "paths": job.params.get("paths"), "attempts": job.attempts},
            output={k: v for k, v in report.items() if k != "errors"} | {"errors": len(report.get("errors") or [])}))
    except Exception:
        log.exception("ingestion job %s not traced", job_id)


def make_queue(url: str) -> App:
    """A procrastinate App on the service's database (psycopg 3 pool)."""
    return TASKS.with_connector(PsycopgConnector(conninfo=libpq_conninfo(url), min_size=1, max_size=4))


async def enqueue(queue: App, job_id: uuid.UUID, jobs: JobRepository) -> int:
    """Put the job in the queue. If that fails (the database down, its disk full) the job and its
    uploads are removed and the caller gets the database's error: nothing stays behind half-made,
    neither a job that looks queued nor one nobody asked about."""
    # Through this app's own job manager: the registered Task object belongs to the template.
    deferrer = procrastinate_tasks.configure_task(name=TASK_NAME, job_manager=queue.job_manager, queue=QUEUE)
    try:
        return await deferrer.defer_async(job_id=str(job_id), request_id=current_request_id())
    except Exception as exc:
        # procrastinate wraps the driver's error; the service error is made from that.
        cause = exc.__cause__ if isinstance(exc, ConnectorException) and isinstance(exc.__cause__, Exception) else exc
        error = await jobs.discard(job_id, cause)
        if not isinstance(error, RagServiceError):
            raise
        raise error from exc


async def recover_stalled_jobs(queue: App, stalled_after_s: float, task_names: tuple[str, ...] = (TASK_NAME,)) -> int:
    """Put back in the queue the jobs whose worker died (no heartbeat for ``stalled_after_s``)."""
    count = 0
    for task_name in task_names:
        stalled = list(await queue.job_manager.get_stalled_jobs(task_name=task_name,
                                                                seconds_since_heartbeat=stalled_after_s))
        for job in stalled:
            log.warning("retrying %s task %s: its worker stopped responding", task_name, job.id)
            await queue.job_manager.retry_job(job)
        count += len(stalled)
    return count


async def run_worker(database_url: str, deps: JobDeps, *, heartbeat_s: float, stalled_after_s: float,
                     also: tuple[QueueConsumer, ...] = (), install_signal_handlers: bool = True) -> None:
    """Consume ingestion jobs (and the ``also`` kinds) until cancelled (or SIGTERM/SIGINT when
    handlers are installed: running jobs finish first). One job of each kind runs at a time: a long
    eval run does not hold up ingestion."""
    queue = make_queue(database_url)
    task_names = (TASK_NAME, *(c.task_name for c in also))
    async with queue.open_async():

        async def recovery_loop() -> None:
            while True:
                try:
                    await recover_stalled_jobs(queue, stalled_after_s, task_names)
                except Exception:  # a transient database error must not stop the worker
                    log.exception("stalled-job recovery failed; will try again")
                await asyncio.sleep(max(1.0, stalled_after_s / 2))

        recovery = asyncio.create_task(recovery_loop())
        started = time.monotonic()
        context = {"ingest": deps, **{c.context_key: c.context for c in also}}
        # One procrastinate worker per queue, each running one job at a time: with one worker over all
        # queues, two eval runs could take every slot and hold ingestion up for hours.
        workers = [Worker(app=queue, queues=[name], name=f"{name}-worker", concurrency=1, additional_context=context,
                          update_heartbeat_interval=heartbeat_s, stalled_worker_timeout=stalled_after_s,
                          install_signal_handlers=False, delete_jobs="successful")
                   for name in (QUEUE, *(c.queue for c in also))]

        def stop_all() -> None:
            for worker in workers:
                worker.stop()

        try:
            queue.perform_import_paths()
            with signals.on_stop(stop_all) if install_signal_handlers else contextlib.nullcontext():
                try:
                    async with asyncio.TaskGroup() as group:
                        for worker in workers:
                            group.create_task(worker.run())
                except ExceptionGroup as failed:  # one worker broke (and the others were stopped): say why
                    raise failed.exceptions[0] from failed
        finally:
            recovery.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await recovery
            log.info("worker stopped after %.0f s", time.monotonic() - started)
