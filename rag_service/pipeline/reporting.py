"""Who hears of a finished query besides its caller: the metrics observer and the trace store.
Neither may cost the caller the answer, nor hold it back for long."""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from rag_service.domain import QueryRequest, QueryResult
from rag_service.pipeline.collaborators import QueryObserver, TraceSink
from rag_service.pipeline.executor import EventSink, no_events
from rag_service.pipeline.results import trace_of

log = logging.getLogger(__name__)


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
    budget_s: float = 5.0  # the trace write, like the log write: a stalled database does not hold the answer

    async def finished(self, request: QueryRequest, masked_question: str, result: QueryResult, events: KeptEvents,
                       api_key_id: uuid.UUID | None) -> None:
        if self.observe is not None:
            try:
                self.observe(request.collection, result)
            except Exception:  # metrics never cost a caller the answer
                log.exception("query observer failed")
        if self.traces is not None:
            try:
                trace = trace_of(request, masked_question, result, events.retrieval, api_key_id)
                await asyncio.wait_for(self.traces.record_trace(trace), self.budget_s)
            except Exception:  # nor does a trace that could not be stored
                log.exception("query trace not stored")
