"""What a serving process runs besides its transport, for as long as it serves: the Runtime, the job
queue it defers to, and the background work (model warm-up, trace cleanup, the experiments'
guardrail, and the in-process worker where Settings ask for one). The HTTP app's lifespan and
``ragsvc mcp`` (stdio) both serve through ``serving``, so the two behave alike."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from procrastinate import App

from ingestion.jobs import make_queue, run_worker
from rag_service.config import Settings
from rag_service.domain import ParseDepth
from rag_service.errors import ProviderError
from rag_service.providers.reader import default_reader
from rag_service.providers.syntax import default_parser
from rag_service.runtime import Runtime

log = logging.getLogger(__name__)
TRACE_CLEANUP_EVERY_S = 3600


@dataclass(frozen=True)
class Services:
    runtime: Runtime
    queue: App  # open: ingestion jobs and eval runs are deferred through it


async def _guard_experiments(runtime: Runtime, every_s: float) -> None:
    """Apply the experiments' guardrail periodically, so a worse candidate is stopped even when
    nobody reads its report."""
    while True:
        await asyncio.sleep(every_s)
        try:
            await runtime.prompts.check_running()
        except Exception:  # the check must keep running for the life of the process
            log.exception("experiment guardrail check failed")


async def _clean_traces(runtime: Runtime, every_s: float) -> None:
    """Delete stored query traces past their retention, at start and then every ``every_s``."""
    while True:
        try:
            deleted = await runtime.traces.delete_older_than(runtime.settings.trace_retention_days)
            if deleted:
                log.info("deleted %d query traces older than %s days", deleted, runtime.settings.trace_retention_days)
            await runtime.store.prune_keyword_changes()
        except Exception:  # the cleanup must keep running for the life of the process
            log.exception("query trace cleanup failed")
        await asyncio.sleep(every_s)


async def _load_parser(depth: ParseDepth) -> None:
    """Load the short-answer parser before the first query needs it (about 3 s on a slow VM); a failure is
    logged here, and the answers then fall back to the model that does not read the parse."""
    try:
        await asyncio.to_thread(default_parser(depth).load)
    except ProviderError as exc:
        log.error("RAGSVC_ANSWER_SHORT_ANSWER_PARSE is on, but %s; short answers will not read the parse", exc)


async def _load_reader() -> None:
    """Load the span reader before the first answer needs it (about 0.3 s); a failure is logged here,
    and the answers then do without it."""
    try:
        await asyncio.to_thread(default_reader().load)
    except ProviderError as exc:
        log.error("RAGSVC_ANSWER_READER is on, but %s; answers will do without the reader", exc)


def freeze_long_lived_objects() -> None:
    """Take what start-up made out of the garbage collector's walks (``gc.unfreeze`` gives it back).

    After start-up a serving process holds about 250,000 objects that live as long as it does
    (modules, the app, the models' Python side), and every full collection of CPython's walks them
    all. Serving SciFact's queries from a 1,000,000-chunk collection, one came about every hundred
    searches and added 146-169 ms to the one it landed in (slow VM, 2026-11-27). ``gc.freeze``
    moves them to the permanent generation: full collections then took 2-5 ms. The collection
    before it frees start-up's garbage rather than keep it for good."""
    gc.collect()
    gc.freeze()


async def _start_up(runtime: Runtime, parse: ParseDepth, reader: bool) -> None:
    """Load the models, then freeze the long-lived objects.

    /readyz turns ready when the embedder has loaded, a moment before the freeze, so a request may
    arrive during it: it then waits for the one collection (about 150 ms), and its own objects are
    frozen with the rest until shutdown. That happens once per process and was accepted rather
    than hold readiness back for the parser's load too."""
    loads = [runtime.warm_up_embedder()]
    if parse != "off":
        loads.append(_load_parser(parse))
    if reader:
        loads.append(_load_reader())
    await asyncio.gather(*loads)
    freeze_long_lived_objects()


@asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[Services]:
    runtime = await asyncio.to_thread(Runtime.open, settings)
    queue = make_queue(runtime.db.url)
    await queue.open_async()
    # The models load in the background: /healthz answers at once, /readyz says "loading".
    background = [asyncio.create_task(_start_up(runtime, settings.answer_short_answer_parse,
                                                                    settings.answer_reader)),
                  asyncio.create_task(_clean_traces(runtime, TRACE_CLEANUP_EVERY_S))]
    if settings.experiment_check_s > 0:
        background.append(asyncio.create_task(_guard_experiments(runtime, settings.experiment_check_s)))
    if settings.runs_serve_worker:
        # One command is enough on the embedded defaults: jobs run inside the server.
        background.append(asyncio.create_task(run_worker(
            runtime.db.url, runtime.job_deps(), also=runtime.other_jobs(), heartbeat_s=settings.worker_heartbeat_s,
            stalled_after_s=settings.job_stalled_after_s, install_signal_handlers=False)))
    try:
        yield Services(runtime, queue)
    finally:
        gc.unfreeze()  # a process that serves again (the tests do) starts from a clean slate
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await queue.close_async()
        if "pipeline" in runtime.__dict__:  # late LLM gradings, then trace writes: up to 10 s each
            await runtime.pipeline.drain(timeout_s=10)
        await runtime.close()
