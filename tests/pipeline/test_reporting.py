"""The trace of a query is written after its answer has gone: the answer does not wait for the
write, a read of the trace (and the late grades that update it) waits for it, shutdown drains it,
and a stalled trace store holds answers back rather than piling up writes. Over fakes; the same
over HTTP and PostgreSQL is tests/test_traces.py."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from rag_service.domain import EvaluationReport, QueryTrace
from rag_service.pipeline import reporting as reporting_module
from rag_service.pipeline.orchestrator import QueryPipeline
from rag_service.pipeline.reporting import QueryReporting
from tests.pipeline.test_orchestrator import FakeCollections, FakeGuidelines, FakeLog, FakeRetriever, ask


class GatedTraces:
    """A trace store whose writes wait for ``gate``; it records what was written, in order."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.written: list[uuid.UUID] = []
        self.order: list[str] = []

    async def record_trace(self, trace: QueryTrace) -> None:
        await self.gate.wait()
        self.written.append(trace.query_id)
        self.order.append("trace")

    async def record_evaluation(self, query_id: uuid.UUID, report: EvaluationReport) -> None:
        self.order.append("evaluation")


def traced_pipeline(traces: GatedTraces) -> tuple[QueryPipeline, QueryReporting]:
    reporting = QueryReporting(traces=traces)
    return QueryPipeline(retriever=FakeRetriever(), collections=FakeCollections(), guidelines=FakeGuidelines(),
                         query_log=FakeLog(), reporting=reporting), reporting


async def test_the_answer_does_not_wait_for_its_trace_and_a_read_does() -> None:
    traces = GatedTraces()
    pipe, reporting = traced_pipeline(traces)
    result = await asyncio.wait_for(pipe.run(ask("How long should the dough rise?")), 5)
    assert traces.written == []  # answered while its trace could not yet be written
    reader = asyncio.create_task(reporting.written(result.query_id))
    await asyncio.sleep(0.01)
    assert not reader.done()
    traces.gate.set()
    await asyncio.wait_for(reader, 5)
    assert traces.written == [result.query_id]
    await reporting.written(uuid.uuid4())  # a trace not being written: nothing to wait for


async def test_a_reader_that_gives_up_does_not_cancel_the_write() -> None:
    traces = GatedTraces()
    pipe, reporting = traced_pipeline(traces)
    result = await pipe.run(ask("How long should the dough rise?"))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reporting.written(result.query_id), 0.01)
    traces.gate.set()
    await pipe.drain(timeout_s=5)
    assert traces.written == [result.query_id]


async def test_drain_waits_for_the_writes_still_running() -> None:
    traces = GatedTraces()
    pipe, _ = traced_pipeline(traces)
    first = await pipe.run(ask("How long should the dough rise?"))
    second = await pipe.run(ask("What does IVFFlat partition?"))
    await pipe.drain(timeout_s=0.01)  # still gated: gives up after the timeout, writes not lost yet
    assert traces.written == []
    asyncio.get_running_loop().call_later(0.02, traces.gate.set)
    await pipe.drain(timeout_s=5)
    assert sorted(traces.written) == sorted([first.query_id, second.query_id])


async def test_late_grades_wait_for_the_trace_they_update() -> None:
    traces = GatedTraces()
    pipe, reporting = traced_pipeline(traces)
    result = await pipe.run(ask("How long should the dough rise?"))
    report = EvaluationReport(overall=0.5, metrics={}, needs_review=False)
    grades = asyncio.create_task(reporting.regraded(result.query_id, report))
    await asyncio.sleep(0.01)
    assert traces.order == []  # the update would find no row yet: it waits
    traces.gate.set()
    await asyncio.wait_for(grades, 5)
    assert traces.order == ["trace", "evaluation"]


async def test_a_stalled_store_holds_answers_back_past_the_pending_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reporting_module, "MAX_PENDING_WRITES", 1)
    traces = GatedTraces()
    pipe, _ = traced_pipeline(traces)
    await pipe.run(ask("How long should the dough rise?"))  # one write pending: the limit
    second = asyncio.create_task(pipe.run(ask("What does IVFFlat partition?")))
    await asyncio.sleep(0.05)
    assert not second.done()  # writes its own trace before answering
    traces.gate.set()
    result = await asyncio.wait_for(second, 5)
    await pipe.drain(timeout_s=5)
    assert result.query_id in traces.written and len(traces.written) == 2


class KeptExports:
    """A Langfuse exporter that keeps what it is handed: (trace id, whether it is the trace's root)."""

    def __init__(self) -> None:
        self.submitted: list[tuple[str, bool]] = []

    def submit(self, record) -> None:  # noqa: ANN001 - a TraceRecord
        self.submitted.append((record.trace_id, record.root is not None))


async def test_the_langfuse_trace_is_queued_after_the_answer_and_before_its_late_grades() -> None:
    exports = KeptExports()
    reporting = QueryReporting(export=exports)  # Langfuse without a trace store
    pipe = QueryPipeline(retriever=FakeRetriever(), collections=FakeCollections(), guidelines=FakeGuidelines(),
                         query_log=FakeLog(), reporting=reporting)
    result = await pipe.run(ask("How long should the dough rise?"))
    assert exports.submitted == []  # built and queued once the answer has gone
    await reporting.regraded(result.query_id, EvaluationReport(overall=0.5, metrics={}, needs_review=False))
    assert exports.submitted == [(result.query_id.hex, True), (result.query_id.hex, False)]
