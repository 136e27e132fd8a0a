"""LLM grading after delivery: the judge and ragas take seconds, so in deliver mode they run once
the caller has its answer. Their grades are stored beside the local ones, replace them in the
answer's trace (stored and in Langfuse), and queue the answer when they find it weak. Running
gradings are bounded (more are skipped, logged) and tracked so shutdown and one-shot CLI runs can
wait for them."""

from __future__ import annotations

import asyncio
import logging
import uuid

from rag_service.pipeline.collaborators import QueryHistory
from rag_service.pipeline.evaluation import AnswerEvaluator, Graded
from rag_service.pipeline.reporting import QueryReporting
from rag_service.pipeline.results import masked_report
from rag_service.review.gate import trigger_for
from rag_service.scoring.evidence import ScoringInput

log = logging.getLogger(__name__)


class LateGrading:
    def __init__(self, evaluator: AnswerEvaluator, grades: QueryHistory, reporting: QueryReporting, *,
                 budget_s: float, max_running: int) -> None:
        self._evaluator = evaluator
        self._grades = grades
        self._reporting = reporting
        self._budget_s = budget_s
        self._max_running = max_running
        self._running: set[asyncio.Task[None]] = set()

    def start(self, inp: ScoringInput, local: Graded, *, query_id: uuid.UUID, collection: str,
              question_hash: str, prompt_name: str | None, prompt_version: int | None) -> None:
        if len(self._running) >= self._max_running:
            log.warning("LLM grading of answer %s skipped: %d gradings already running", query_id,
                        len(self._running))
            return

        async def grade() -> None:
            try:
                combined = await asyncio.wait_for(self._evaluator.with_llm(inp, local), self._budget_s)
                if combined is None:
                    return
                graded, notes = combined
                if notes:
                    log.info("LLM grading of %s: %s", query_id, "; ".join(notes))
                report = masked_report(graded.report)
                await self._grades.record_grades(
                    query_id, collection=collection, question_hash=question_hash,
                    report=report, trigger=trigger_for(graded.verdict, graded.evaluation),
                    prompt_name=prompt_name, prompt_version=prompt_version)
                await self._reporting.regraded(query_id, report)
            except Exception:  # the caller has its answer; a failed late grading is logged, not raised
                log.exception("LLM grading of answer %s failed", query_id)

        task = asyncio.create_task(grade())
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def drain(self, timeout_s: float | None = None) -> None:
        """Wait for gradings still running, at most ``timeout_s``."""
        if self._running:
            _, pending = await asyncio.wait(list(self._running), timeout=timeout_s)
            if pending:
                log.warning("%d LLM gradings still running at shutdown; their grades are lost", len(pending))
