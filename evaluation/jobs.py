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

TASK_NAME = "eval_run"
QUEUE = "eval"
CONTEXT_KEY = "eval"


@TASKS.task(name=TASK_NAME, queue=QUEUE, pass_context=True)
async def eval_task(context: JobContext, run_id: str) -> None:
    runner: EvalRunner = context.additional_context[CONTEXT_KEY]
    # force: the queue gives a job to one worker at a time; a retried job's run may look recent.
    await runner.execute(uuid.UUID(run_id), force=True)


def consumer(runner: EvalRunner) -> QueueConsumer:
    return QueueConsumer(queue=QUEUE, task_name=TASK_NAME, context_key=CONTEXT_KEY, context=runner)


async def enqueue_run(queue: App, run_id: uuid.UUID) -> int:
    deferrer = procrastinate_tasks.configure_task(name=TASK_NAME, job_manager=queue.job_manager, queue=QUEUE)
    return await deferrer.defer_async(run_id=str(run_id))
