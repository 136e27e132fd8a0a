"""Eval runs as jobs on the PostgreSQL queue (procrastinate), beside ingestion: ``POST
/v1/eval-runs`` (or ``ragsvc eval run --queue``) records the run and defers a task carrying only its
id; any worker (``ragsvc worker``, or the one inside ``ragsvc serve``) executes it. A worker that
dies leaves the run resumable: the stalled task is retried and skips the items already stored."""

from __future__ import annotations

import uuid

from procrastinate import App, JobContext
from procrastinate import tasks as procrastinate_tasks

from evaluation.runner import EvalRunner
from ingestion.jobs import TASKS, QueueConsumer
from rag_service.db.repos.eval_runs import EvalRunRepository
from rag_service.observability.logs import bind_request_id
from rag_service.observability.logs import request_id as current_request_id

TASK_NAME = "eval_run"
QUEUE = "eval"
CONTEXT_KEY = "eval"


@TASKS.task(name=TASK_NAME, queue=QUEUE, pass_context=True)
async def eval_task(context: JobContext, run_id: str, request_id: str | None = None) -> None:
    runner: EvalRunner = context.additional_context[CONTEXT_KEY]
    bind_request_id(request_id)
    # A retried job (its worker died) may find its run's heartbeat still recent: it takes the run over.
    # A first attempt does not: if someone resumed the run by hand meanwhile, that process keeps it.
    await runner.execute(uuid.UUID(run_id), force=bool(context.job.attempts))


def consumer(runner: EvalRunner) -> QueueConsumer:
    return QueueConsumer(queue=QUEUE, task_name=TASK_NAME, context_key=CONTEXT_KEY, context=runner)


async def enqueue_run(queue: App, run_id: uuid.UUID, runs: EvalRunRepository) -> int:
    """Defer the run; if that fails, the run says so instead of staying 'queued' for ever."""
    deferrer = procrastinate_tasks.configure_task(name=TASK_NAME, job_manager=queue.job_manager, queue=QUEUE)
    try:
        return await deferrer.defer_async(run_id=str(run_id), request_id=current_request_id())
    except Exception as exc:
        await runs.finish(run_id, summary={}, error=f"could not be queued: {type(exc).__name__}: {exc}")
        raise
