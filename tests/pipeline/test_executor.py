"""The plan executor with fake steps (no database, no model): concurrency, budgets, retries,
fallbacks, soft steps, event order, and errors that name the step."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from rag_service.errors import (
    DatabaseUnavailableError,
    InvalidInputError,
    StepFailedError,
    StepTimeoutError,
)
from rag_service.pipeline.executor import Executor, Fallback, Plan, RetryPolicy, Step

FAST_RETRIES = RetryPolicy(attempts=3, backoff_multiplier_s=0.001, backoff_max_s=0.01)


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, kind: str, data: dict[str, Any]) -> None:
        self.seen.append((kind, data))

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [d for k, d in self.seen if k == kind]


def returning(value: object, delay_s: float = 0.0) -> Callable[[], Awaitable[object]]:
    async def run() -> object:
        await asyncio.sleep(delay_s)
        return value
    return run


async def test_independent_steps_run_concurrently_and_dependents_wait() -> None:
    started: dict[str, float] = {}

    def timed(name: str, delay_s: float):  # noqa: ANN202
        async def run() -> str:
            started[name] = time.perf_counter()
            await asyncio.sleep(delay_s)
            return name
        return run

    plan = Plan((Step("a", "retrieve", timed("a", 0.5)), Step("b", "retrieve", timed("b", 0.5)),
                 Step("c", "retrieve", timed("c", 0.5)),
                 Step("join", "generate", timed("join", 0.0), depends_on=("a", "b", "c"))))
    begin = time.perf_counter()
    results = await Executor().run(plan)
    elapsed = time.perf_counter() - begin
    assert results == {"a": "a", "b": "b", "c": "c", "join": "join"}
    assert elapsed < 1.0, "three 500 ms steps without dependencies must overlap (in series: 1.5 s)"
    assert started["join"] - begin >= 0.49, "a step starts only after its dependencies are done"


async def test_a_step_starts_as_soon_as_its_own_dependencies_are_done() -> None:
    finished: list[str] = []

    def note(name: str, delay_s: float):  # noqa: ANN202
        async def run() -> None:
            await asyncio.sleep(delay_s)
            finished.append(name)
        return run

    # "fast-next" needs only "fast": it must not wait for the slow, independent step.
    plan = Plan((Step("slow", "x", note("slow", 0.4)), Step("fast", "x", note("fast", 0.05)),
                 Step("fast-next", "x", note("fast-next", 0.05), depends_on=("fast",))))
    await Executor().run(plan)
    assert finished == ["fast", "fast-next", "slow"]


async def test_budget_expiry_is_a_timeout_naming_the_step() -> None:
    events = Events()
    plan = Plan((Step("retrieve-2", "retrieve", returning("late", delay_s=1.0), budget_s=0.05),))
    with pytest.raises(StepTimeoutError) as caught:
        await Executor(emit=events).run(plan)
    assert caught.value.step == "retrieve-2"
    assert "retrieve-2" in str(caught.value) and "0.05 s" in str(caught.value)
    assert events.of("step.end")[0]["status"] == "failed"


async def test_transient_errors_are_retried_then_succeed() -> None:
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise DatabaseUnavailableError("connection refused")
        return "ok"

    run = Executor(retry=FAST_RETRIES)
    assert await run.run_step(Step("route", "route", flaky, retry=True)) == "ok"
    assert calls == 3
    assert run.records[0].status == "ok" and run.records[0].attempts == 3


async def test_retries_give_up_and_keep_the_error_class_with_the_step_named() -> None:
    calls = 0

    async def down() -> None:
        nonlocal calls
        calls += 1
        raise DatabaseUnavailableError("connection refused")

    run = Executor(retry=FAST_RETRIES)
    with pytest.raises(DatabaseUnavailableError) as caught:
        await run.run_step(Step("intent", "intent", down, retry=True))
    assert calls == 3 and caught.value.step == "intent" and caught.value.status_code == 503
    assert run.records[0].attempts == 3


async def test_errors_that_are_not_transient_are_not_retried() -> None:
    calls = 0

    async def refused() -> None:
        nonlocal calls
        calls += 1
        raise InvalidInputError("bad filter")

    with pytest.raises(InvalidInputError):
        await Executor(retry=FAST_RETRIES).run_step(Step("retrieve-1", "retrieve", refused, retry=True))
    assert calls == 1


async def test_a_failing_step_falls_back_and_says_why() -> None:
    events = Events()

    async def primary() -> str:
        raise DatabaseUnavailableError("LLM down")

    async def fallback(error: BaseException) -> Fallback:
        return Fallback("extractive answer", f"primary failed ({error})")

    value = await Executor(emit=events).run_step(Step("generate", "generate", primary, fallback=fallback))
    assert value == "extractive answer"
    end = events.of("step.end")[0]
    assert end["status"] == "fallback" and "LLM down" in end["detail"]


async def test_a_timed_out_step_falls_back_within_the_fallback_budget() -> None:
    async def fallback(error: BaseException) -> Fallback:
        assert isinstance(error, TimeoutError)
        return Fallback("quick", "timed out")

    run = Executor()
    value = await run.run_step(Step("generate", "generate", returning("slow", 1.0), budget_s=0.05,
                                    fallback=fallback, fallback_budget_s=0.5))
    assert value == "quick" and run.records[0].status == "fallback"


async def test_fallback_only_for_the_errors_it_covers() -> None:
    async def buggy() -> None:
        raise KeyError("oops")

    async def fallback(error: BaseException) -> Fallback:  # pragma: no cover - must not run
        raise AssertionError("the fallback covers service errors only")

    with pytest.raises(StepFailedError) as caught:
        await Executor().run_step(Step("generate", "generate", buggy, fallback=fallback,
                                       fallback_on=(DatabaseUnavailableError,)))
    assert caught.value.step == "generate" and "KeyError" in str(caught.value)


async def test_an_unexpected_error_is_logged_and_named_without_its_text(caplog: pytest.LogCaptureFixture) -> None:
    async def broken() -> None:
        raise ZeroDivisionError("secret row 42")

    with pytest.raises(StepFailedError) as caught:
        await Executor().run(Plan((Step("verify", "verify", broken),)))
    assert caught.value.step == "verify" and caught.value.status_code == 500
    assert "step verify failed unexpectedly (ZeroDivisionError)" in str(caught.value)
    assert "secret" not in str(caught.value)
    assert any(r.exc_info and "secret row 42" in str(r.exc_info[1]) for r in caplog.records)


async def test_a_failing_fallback_fails_the_step_with_its_own_error() -> None:
    async def primary() -> None:
        raise DatabaseUnavailableError("LLM down")

    async def fallback(error: BaseException) -> Fallback:
        raise InvalidInputError("nothing to fall back on")

    run = Executor()
    with pytest.raises(InvalidInputError, match="nothing to fall back on") as caught:
        await run.run_step(Step("generate", "generate", primary, fallback=fallback))
    assert caught.value.step == "generate" and run.records[0].status == "failed"


async def test_a_timeout_falls_back_only_where_the_step_covers_timeouts() -> None:
    async def fallback(error: BaseException) -> Fallback:  # pragma: no cover - must not run
        raise AssertionError("timeouts are not covered")

    with pytest.raises(StepTimeoutError) as caught:
        await Executor().run_step(Step("verify", "verify", returning("late", 1.0), budget_s=0.05, fallback=fallback,
                                       fallback_on=(InvalidInputError,)))
    assert caught.value.step == "verify" and caught.value.status_code == 504


async def test_a_step_can_pass_on_a_degraded_result_as_a_fallback() -> None:
    run = Executor()
    value = await run.run_step(Step("verify", "verify", returning(Fallback("answer", "generated by the fallback"))))
    assert value == "answer"
    assert run.records[0].status == "fallback" and run.records[0].detail == "generated by the fallback"


async def test_a_soft_step_failure_is_recorded_and_the_plan_goes_on() -> None:
    async def fails() -> None:
        raise DatabaseUnavailableError("down")

    run = Executor()
    results = await run.run(Plan((Step("persist", "persist", fails, soft=True),
                                  Step("after", "x", returning(1), depends_on=("persist",)))))
    assert results == {"persist": None, "after": 1}
    assert [r.status for r in run.records] == ["failed", "ok"]


async def test_a_hard_failure_cancels_the_steps_still_running() -> None:
    cancelled = asyncio.Event()

    async def long_running() -> None:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def fails() -> None:
        await asyncio.sleep(0.01)
        raise InvalidInputError("no")

    with pytest.raises(InvalidInputError):
        await Executor().run(Plan((Step("slow", "x", long_running), Step("bad", "x", fails))))
    assert cancelled.is_set()


async def test_records_follow_the_plan_whichever_parallel_step_ends_first() -> None:
    run = Executor()
    await run.run(Plan((Step("retrieve-1", "retrieve", returning(1, 0.2)), Step("retrieve-2", "retrieve", returning(2)),
                        Step("generate", "generate", returning(3), depends_on=("retrieve-1", "retrieve-2")))))
    assert [r.id for r in run.records] == ["retrieve-1", "retrieve-2", "generate"]


async def test_events_come_in_order_for_each_step() -> None:
    events = Events()
    plan = Plan((Step("first", "a", returning(1)), Step("second", "b", returning(2), depends_on=("first",))))
    await Executor(emit=events).run(plan)
    assert [(k, d["step"]) for k, d in events.seen] == [
        ("step.start", "first"), ("step.end", "first"), ("step.start", "second"), ("step.end", "second")]
    assert events.seen[0][1]["kind"] == "a" and events.seen[1][1]["status"] == "ok"


def test_plans_are_checked_when_built() -> None:
    with pytest.raises(ValueError, match="cycle"):
        Plan((Step("a", "x", returning(1), depends_on=("b",)), Step("b", "x", returning(1), depends_on=("a",))))
    with pytest.raises(ValueError, match="unknown steps"):
        Plan((Step("a", "x", returning(1), depends_on=("missing",)),))
    with pytest.raises(ValueError, match="unique"):
        Plan((Step("a", "x", returning(1)), Step("a", "x", returning(2))))
    with pytest.raises(ValueError, match="budgets"):
        Step("a", "x", returning(1), budget_s=0)
    described = Plan((Step("a", "k", returning(1)), Step("b", "k", returning(1), depends_on=("a",)))).describe()
    assert described == [{"id": "a", "kind": "k", "depends_on": []}, {"id": "b", "kind": "k", "depends_on": ["a"]}]
