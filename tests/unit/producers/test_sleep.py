"""Durable timers in memory: ``ctx.sleep`` / ``ctx.sleep_until`` record their wake time once, let go
of the run beyond the in-process threshold, and a crash anywhere around the sleep never makes the run
sleep twice or longer (:class:`runlog.testing.InMemoryWorld`)."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest

from runlog.producers import AsyncStageContext, StageContext, Workflow, tool
from runlog.producers.calls import _call_steps
from runlog.schemas import EventType, ReplayPolicy
from runlog.schemas.errors import WorkflowDefinitionError
from runlog.testing import InMemoryWorld

SLEEP_CALL = "nap/runlog.sleep/1"  # after the note at position 0


@tool("note", policy=ReplayPolicy.SAFE)
def note(call: Any, text: str) -> str:
    return text


def _workflow(seconds: float = 0.4, *, use_async: bool = False) -> Workflow:
    wf = Workflow("napper", version="1")
    if use_async:
        @wf.stage("nap")
        async def anap(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
            await ctx.call(note, text="before")
            await ctx.sleep(seconds)
            await ctx.call(note, text="after")
            return {"ok": True}
    else:
        @wf.stage("nap")
        def nap(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
            ctx.call(note, text="before")
            ctx.sleep(seconds)
            ctx.call(note, text="after")
            return {"ok": True}
    return wf


@pytest.fixture
def durable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every sleep takes the durable path (the in-process threshold at 0), so tests sleep briefly."""
    monkeypatch.setattr(_call_steps, "INLINE_SLEEP_S", 0.0)


def _sleep_events(events: Any) -> list[tuple[EventType, dict[str, str]]]:
    return [(e.type, dict(e.attributes)) for e in events if e.call_id == SLEEP_CALL]


def _waits(world: InMemoryWorld, run_id: str) -> list[int]:
    sleeps = _sleep_events(world.events(run_id))
    return [int(a["deadline_ms"]) for t, a in sleeps if t is EventType.RUN_WAITING]


def _wake_until(world: InMemoryWorld, run_id: str, wake_ms: int) -> Any:
    time.sleep(max(0.0, wake_ms / 1000 - time.time()) + 0.02)
    return world.resume(run_id)


def test_a_durable_sleep_lets_go_of_the_run_and_wakes_at_its_recorded_time(durable: None) -> None:
    world = InMemoryWorld()
    wf = _workflow(0.4)
    t0 = time.time()
    res = world.run(wf, {})
    assert res.waiting == "runlog.sleep" and not res.completed
    state = world.state(res.run_id)
    assert state is not None and state.status.value == "WAITING"
    assert state.waiting is not None and state.waiting.call_id == SLEEP_CALL
    wake = state.waiting.deadline_ms
    assert int(t0 * 1000) + 400 <= wake <= time.time() * 1000 + 400  # the wake time is whole ms
    assert res.run_id not in world.leases.held  # no lease while it sleeps
    assert world.resume(res.run_id).result == "waiting"  # too early: nothing appended
    out = _wake_until(world, res.run_id, wake)
    assert out.result == "completed", out
    assert time.time() * 1000 >= wake
    kinds = [t for t, _ in _sleep_events(world.events(res.run_id))]
    assert kinds == [EventType.TOOL_CALLED, EventType.RUN_WAITING, EventType.SIGNAL_RECEIVED]
    assert world.executions(res.run_id)["note"] == 2  # before (its result reused on the wake), after


@pytest.mark.parametrize("use_async", [False, True])
def test_a_crash_after_the_sleep_is_recorded_does_not_sleep_twice(durable: None, use_async: bool) -> None:
    world = InMemoryWorld()
    wf = _workflow(0.5, use_async=use_async)
    run_id, _ = world.crash(wf, {}, at=f"after:RUN_WAITING:{SLEEP_CALL}")
    [wake] = _waits(world, run_id)
    assert world.resume(run_id).result == "waiting"  # its wake time is the recorded one: not yet
    out = _wake_until(world, run_id, wake)
    assert out.result == "completed", out
    sleeps = _sleep_events(world.events(run_id))
    assert [t for t, _ in sleeps] == [EventType.TOOL_CALLED, EventType.RUN_WAITING, EventType.SIGNAL_RECEIVED]


def test_a_crash_between_the_sleep_and_its_wait_keeps_the_first_wake_time(durable: None) -> None:
    world = InMemoryWorld()
    wf = _workflow(0.6)
    run_id, _ = world.crash(wf, {}, at=f"after:TOOL_CALLED:{SLEEP_CALL}")
    [(_, called)] = _sleep_events(world.events(run_id))
    wake = int(called["wake_at_ms"])
    time.sleep(0.2)  # the resume comes later than the sleep began: it must not push the wake time back
    assert world.resume(run_id).result == "waiting"
    assert _waits(world, run_id) == [wake]
    assert _wake_until(world, run_id, wake).result == "completed"
    assert [t for t, _ in _sleep_events(world.events(run_id))].count(EventType.TOOL_CALLED) == 1


def test_a_crash_after_the_wake_is_recorded_goes_straight_on(durable: None) -> None:
    world = InMemoryWorld()
    wf = _workflow(0.3)
    res = world.run(wf, {})
    state = world.state(res.run_id)
    assert state is not None and state.waiting is not None
    time.sleep(max(0.0, state.waiting.deadline_ms / 1000 - time.time()) + 0.02)
    # the wake is recorded, then the process dies before the stage ends
    from runlog.producers import crash as _crash
    from runlog.testing import SimulatedCrash

    def die(point: str) -> None:
        raise SimulatedCrash(point)

    _crash.on_crash(die)
    _crash.arm(f"after:SIGNAL_RECEIVED:{SLEEP_CALL}")
    try:
        with pytest.raises(SimulatedCrash):
            world.resume(res.run_id)
    finally:
        _crash.arm(None)
        _crash.on_crash(None)
    world.leases.expire(res.run_id)
    out = world.resume(res.run_id)
    assert out.result == "completed", out
    kinds = [t for t, _ in _sleep_events(world.events(res.run_id))]
    assert kinds == [EventType.TOOL_CALLED, EventType.RUN_WAITING, EventType.SIGNAL_RECEIVED]


def test_a_short_sleep_is_slept_in_the_process_and_recorded() -> None:
    world = InMemoryWorld()
    t0 = time.monotonic()
    res = world.run(_workflow(0.2), {})
    assert res.completed and time.monotonic() - t0 >= 0.2
    assert [t for t, _ in _sleep_events(world.events(res.run_id))] == [EventType.TOOL_CALLED,
                                                                        EventType.TOOL_RESULT]


def test_sleep_until_a_past_time_returns_at_once_and_bad_times_are_refused() -> None:
    wf = Workflow("until", version="1")
    seen: list[str] = []

    @wf.stage("nap")
    def nap(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        ctx.sleep_until(dt.datetime(2001, 1, 1, tzinfo=dt.UTC))
        for bad in (dt.datetime(2001, 1, 1), "soon", float("nan")):
            try:
                ctx.sleep_until(bad)  # type: ignore[arg-type]
            except WorkflowDefinitionError as err:
                seen.append(str(err))
        for bad_s in (-1, float("inf"), True):
            try:
                ctx.sleep(bad_s)
            except WorkflowDefinitionError as err:
                seen.append(str(err))
        return {}

    res = InMemoryWorld().run(wf, {})
    assert res.completed
    assert len(seen) == 6 and "naive" in seen[0]
