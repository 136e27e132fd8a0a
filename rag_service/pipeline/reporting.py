"""Who hears of a finished query besides its caller: the metrics observer, the trace store and
Langfuse. None of them may cost the caller the answer, nor hold it back: the observer is a counter
update, and the trace is built, queued for Langfuse and written after the answer has gone (a read
of it, or its late grades, waits for that)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rag_service.domain import EvaluationReport, QueryRequest, QueryResult
from rag_service.domain.costs import Prices, generation_cost
from rag_service.observability.logs import request_id
from rag_service.observability.trace_tree import TraceExporter, TraceRecord, evaluation_scores, query_trace
from rag_service.pipeline.collaborators import QueryObserver, TraceSink
from rag_service.pipeline.executor import EventSink, no_events
from rag_service.pipeline.guardrails import mask_pii
from rag_service.pipeline.results import trace_of

log = logging.getLogger(__name__)

# Trace writes still running past this many: the next answer waits for its own. A slow or stalled
# database then holds answers back, as the log write does, rather than piling up tasks, and the
# writes never hold more than this many of the pool's connections (16 + 16 overflow by default)
# ahead of live queries. At 35 answers/s and a few ms a write, about one is in flight.
MAX_PENDING_WRITES = 8


@dataclass
class KeptEvents:
    """Passes the pipeline's events on and keeps the "retrieval" one (the passages with each
    strategy's rank) for the trace."""

    emit: EventSink = no_events
    retrieval: dict[str, Any] | None = field(default=None)

    async def __call__(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "retrieval":
            self.retrieval = data
        await self.emit(kind, data)


@dataclass(frozen=True)
class QueryReporting:
    observe: QueryObserver | None = None
    traces: TraceSink | None = None
    export: TraceExporter | None = None  # Langfuse, when its keys are set
    prices: Prices = field(default_factory=Prices)
    budget_s: float = 5.0  # the trace write, like the log write: a stalled database does not hold the answer
    # The traces being written, by query id. While answers waited for the INSERT, the time each
    # request spent outside the pipeline was 2.7-3.0 ms longer at p95 (the round trip's p95 fell by
    # 1.2-1.6 ms when it stopped: docs/benchmarks.md, "Cost of metrics, logs and traces").
    _writes: dict[uuid.UUID, asyncio.Task[None]] = field(default_factory=dict, init=False, repr=False,
                                                         compare=False)

    async def finished(self, request: QueryRequest, masked_question: str, result: QueryResult, events: KeptEvents,
                       api_key_id: uuid.UUID | None) -> None:
        if self.observe is not None:
            try:
                self.observe(request.collection, result)
            except Exception:  # metrics never cost a caller the answer
                log.exception("query observer failed")
        if self.traces is None and self.export is None:
            return
        # Built after the answer has gone too (0.47 / 0.61 ms p50 / p95 on XQuAD answers); nothing
        # changes the result once the pipeline has returned it.
        # The spans are placed back from the end time by each step's duration: read it now.
        report = self._report(request, masked_question, result, events.retrieval, api_key_id, datetime.now(UTC))
        if len(self._writes) >= MAX_PENDING_WRITES:
            await report
            return
        task = asyncio.create_task(report)
        self._writes[result.query_id] = task
        task.add_done_callback(lambda _done, query_id=result.query_id: self._writes.pop(query_id, None))

    async def _report(self, request: QueryRequest, masked_question: str, result: QueryResult,
                      retrieval: dict[str, Any] | None, api_key_id: uuid.UUID | None, ended_at: datetime) -> None:
        """The query's trace to Langfuse (queued) and to the trace store."""
        try:
            trace = trace_of(request, masked_question, result, retrieval, api_key_id)
        except Exception:
            log.exception("query trace not built")
            return
        if self.export is not None:
            try:
                self.export.submit(query_trace(
                    trace, answer=mask_pii(result.answer) if result.answer else None, ended_at=ended_at,
                    cost_usd=generation_cost(result.generator, result.llm_tokens, self.prices),
                    request_id=request_id(),
                    conversation_id=mask_pii(result.conversation_id) if result.conversation_id else None))
            except Exception:  # nor does tracing
                log.exception("query trace not exported")
        if self.traces is None:
            return
        try:
            await asyncio.wait_for(self.traces.record_trace(trace), self.budget_s)
        except Exception:  # nor does a trace that could not be stored
            log.exception("query trace not stored")

    async def written(self, query_id: uuid.UUID) -> None:
        """Return once the trace of ``query_id`` is no longer being written (stored, or given up)."""
        task = self._writes.get(query_id)
        if task is not None:
            await asyncio.shield(task)  # a reader that gives up must not cancel the write

    async def drain(self, timeout_s: float | None = None) -> None:
        """Wait for the trace writes still running, at most ``timeout_s``."""
        if self._writes:
            _, pending = await asyncio.wait(list(self._writes.values()), timeout=timeout_s)
            if pending:
                log.warning("%d query traces still being written at shutdown; they are lost", len(pending))

    async def regraded(self, query_id: uuid.UUID, report: EvaluationReport) -> None:
        """The late LLM grades of an answer (masked): they replace the delivered grades in the stored
        trace, and in Langfuse (the scores' ids are the same, so they overwrite)."""
        await self.written(query_id)  # the grades update the stored trace: it must be there
        if self.export is not None:
            try:
                scores = evaluation_scores(query_id.hex, report)
                self.export.submit(TraceRecord(trace_id=query_id.hex, name="query", root=None, scores=scores))
            except Exception:
                log.exception("late grades of %s not exported", query_id)
        if self.traces is not None:
            try:
                await asyncio.wait_for(self.traces.record_evaluation(query_id, report), self.budget_s)
            except Exception:
                log.exception("late grades of %s not stored in the trace", query_id)
