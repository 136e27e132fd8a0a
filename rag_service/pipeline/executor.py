"""The plan executor: runs a plan's steps as soon as their dependencies are done, each within its
time budget, retrying transient failures with exponential backoff (tenacity), falling back where
the step has a fallback, and emitting an event when each step starts and ends.

It knows nothing of questions or answers: steps are named coroutines. A failed step is named in
the error it raises (``error.step``), so the edges can say which step of the plan failed.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from rag_service.domain import StepRecord, StepStatus
from rag_service.errors import (
    DatabaseTimeoutError,
    DatabaseUnavailableError,
    ProviderError,
    RagServiceError,
    StepFailedError,
    StepTimeoutError,
)

log = logging.getLogger(__name__)

EventSink = Callable[[str, dict[str, Any]], Awaitable[None]]
# What is worth trying again: the database or a provider was briefly unreachable or slow.
TRANSIENT: tuple[type[BaseException], ...] = (DatabaseUnavailableError, DatabaseTimeoutError, ProviderError)


@dataclass(frozen=True)
class Fallback:
    """What a step's fallback produced, and why the step fell back (shown to the caller). A step's
    ``run`` may return one too, when what it passes on is itself a fallback's result."""

    value: Any
    reason: str


@dataclass(frozen=True)
class Step:
    id: str
    kind: str
    run: Callable[[], Awaitable[Any]]
    depends_on: tuple[str, ...] = ()
    budget_s: float = 10.0
    retry: bool = False  # retry transient errors (TRANSIENT) with backoff
    # Called with the error when ``run`` fails with one of ``fallback_on`` (after its retries; a
    # budget that runs out is a TimeoutError); it has its own budget, ``fallback_budget_s``
    # (default: ``budget_s``).
    fallback: Callable[[BaseException], Awaitable[Fallback]] | None = None
    fallback_on: tuple[type[BaseException], ...] = (Exception,)
    fallback_budget_s: float | None = None
    soft: bool = False  # a failure is recorded and the plan goes on (its result is None)

    def __post_init__(self) -> None:
        if self.budget_s <= 0 or (self.fallback_budget_s is not None and self.fallback_budget_s <= 0):
            raise ValueError(f"step {self.id}: budgets must be > 0 seconds")


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]

    def __post_init__(self) -> None:
        ids = [s.id for s in self.steps]
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        if repeated:
            raise ValueError(f"plan step ids must be unique; repeated: {repeated}")
        for step in self.steps:
            unknown = sorted(set(step.depends_on) - set(ids))
            if unknown:
                raise ValueError(f"step {step.id} depends on unknown steps {unknown}")
        done: set[str] = set()
        pending = list(self.steps)
        while pending:
            ready = [s for s in pending if set(s.depends_on) <= done]
            if not ready:
                raise ValueError(f"plan has a dependency cycle among {sorted(s.id for s in pending)}")
            done.update(s.id for s in ready)
            pending = [s for s in pending if s.id not in done]

    def describe(self) -> list[dict[str, Any]]:
        return [{"id": s.id, "kind": s.kind, "depends_on": list(s.depends_on)} for s in self.steps]


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 3
    backoff_multiplier_s: float = 0.05
    backoff_max_s: float = 1.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be >= 1")


async def no_events(kind: str, data: dict[str, Any]) -> None:
    return None


@dataclass
class Executor:
    """Runs the steps of one request. ``results`` fill in as steps finish; ``records`` list the
    finished steps in the order they started (concurrent steps start in plan order), so the
    record of a request does not depend on which of two parallel steps happened to end first."""

    emit: EventSink = no_events
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    results: dict[str, Any] = field(default_factory=dict)
    _records: list[tuple[int, StepRecord]] = field(default_factory=list)
    _started: int = 0
    _t0: float = field(default_factory=time.perf_counter)  # the steps' start offsets count from here

    @property
    def records(self) -> list[StepRecord]:
        return [record for _, record in self._records]

    def timings_ms(self) -> dict[str, float]:
        """Milliseconds per finished step, by step id."""
        return {record.id: round(record.elapsed_ms, 2) for _, record in self._records}

    async def run(self, plan: Plan) -> dict[str, Any]:
        """Every step, each started as soon as its dependencies are done; the results by step id.
        The first hard failure cancels the steps still running and is raised."""
        pending = {s.id: s for s in plan.steps}
        running: dict[asyncio.Task[Any], Step] = {}
        done: set[str] = set()
        try:
            while pending or running:
                for step in [s for s in pending.values() if set(s.depends_on) <= done]:
                    del pending[step.id]
                    running[asyncio.create_task(self.run_step(step))] = step
                finished, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in finished:
                    step = running.pop(task)
                    self.results[step.id] = task.result()  # raises the step's error
                    done.add(step.id)
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
        return self.results

    async def run_step(self, step: Step) -> Any:
        """One step with its budget, retries and fallback, between a start and an end event."""
        order = self._started
        self._started += 1
        await self.emit("step.start", {"step": step.id, "kind": step.kind})
        started = time.perf_counter()
        attempts = 0
        budget = step.budget_s
        try:
            try:
                async for attempt in AsyncRetrying(
                    stop=stop_after_attempt(self.retry.attempts if step.retry else 1),
                    wait=wait_exponential(multiplier=self.retry.backoff_multiplier_s, max=self.retry.backoff_max_s),
                    retry=retry_if_exception_type(TRANSIENT), reraise=True,
                ):
                    with attempt:
                        attempts += 1
                        value = await asyncio.wait_for(step.run(), step.budget_s)
            except step.fallback_on as exc:
                if step.fallback is None:
                    raise
                log.warning("step %s failed (%s); falling back", step.id, _describe(exc, budget))
                budget = step.fallback_budget_s or step.budget_s
                fallback = await asyncio.wait_for(step.fallback(exc), budget)
                await self._end(step, order, started, attempts, "fallback", fallback.reason)
                return fallback.value
        except Exception as exc:
            detail = _describe(exc, budget)
            await self._end(step, order, started, attempts, "failed", detail)
            if step.soft:
                log.warning("step %s failed (the plan goes on): %s", step.id, detail)
                return None
            error = _named(exc, step, detail)
            if error is exc:
                raise
            raise error from exc
        if isinstance(value, Fallback):
            await self._end(step, order, started, attempts, "fallback", value.reason)
            return value.value
        await self._end(step, order, started, attempts, "ok", None)
        return value

    async def _end(self, step: Step, order: int, started: float, attempts: int, status: StepStatus,
                   detail: str | None) -> None:
        elapsed = (time.perf_counter() - started) * 1000
        record = StepRecord(id=step.id, kind=step.kind, status=status, elapsed_ms=elapsed, attempts=max(attempts, 1),
                            detail=detail, started_ms=round((started - self._t0) * 1000, 3))
        bisect.insort(self._records, (order, record), key=lambda entry: entry[0])
        await self.emit("step.end", {"step": step.id, "status": status, "elapsed_ms": round(elapsed, 2),
                                     **({"detail": detail} if detail else {})})


def _describe(exc: BaseException, budget_s: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"timed out after {budget_s} s"
    return str(exc) or type(exc).__name__


def _named(exc: Exception, step: Step, detail: str) -> RagServiceError:
    """The error to raise for a failed step, naming it: a timeout becomes StepTimeoutError, a
    service error keeps its class (and HTTP status), anything else (a bug) is logged and becomes a
    StepFailedError."""
    if isinstance(exc, TimeoutError):
        error: RagServiceError = StepTimeoutError(f"step {step.id} {detail}", stage=step.kind)
    elif isinstance(exc, RagServiceError):
        error = exc
    else:
        # A bug: the traceback goes to the log, the caller learns which step failed and no more
        # (an exception's text may hold data or SQL).
        log.error("step %s failed unexpectedly", step.id, exc_info=exc)
        error = StepFailedError(f"step {step.id} failed unexpectedly ({type(exc).__name__}); it has been logged",
                                stage=step.kind)
    if error.step is None:
        error.step = step.id
    return error
