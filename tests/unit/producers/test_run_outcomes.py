"""A run's outcome, awaited wherever it executes (:class:`RunOutcomes`, ``RunHandle.result``): the
outputs of a completed run, a typed error for a failed, blocked or cancelled one, a timeout for one
that goes on, and the log's word when the projection stays behind. In memory, no services."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import pytest

from runlog import ResumeBlocked, RunCancelled, RunFailed, RunHandle, TerminalToolError, Workflow, tool
from runlog.producers.run._outcome import RunOutcomes
from runlog.projections import RunStatus
from runlog.schemas import ErrorInfo
from runlog.testing import InMemoryWorld


@tool("shout")
def shout(call: Any, text: str) -> dict[str, Any]:
    return {"text": text.upper()}


@tool("refuse")
def refuse(call: Any) -> dict[str, Any]:
    raise TerminalToolError("the card was declined")


def _flow(fail: bool = False) -> Workflow:
    wf = Workflow("loud", "1")

    @wf.stage("say")
    def say(ctx: Any, inputs: Any) -> dict[str, Any]:
        return ctx.call(shout, text=ctx.params["text"])

    @wf.stage("pay")
    def pay(ctx: Any, inputs: Any) -> dict[str, Any]:
        return ctx.call(refuse) if fail else {"paid": True}

    return wf


def test_a_completed_run_gives_its_outputs_to_any_handle() -> None:
    world = InMemoryWorld()
    ran = world.runner().run(_flow(), {"text": "hi"})
    assert ran.completed
    outcomes = RunOutcomes(world.log, world.artifacts)
    got = outcomes.result(ran.run_id, timeout=5)
    assert got.completed and got.outputs == ran.outputs == {"say": {"text": "HI"}, "pay": {"paid": True}}
    handle = world.runner("elsewhere").handing_out(RunHandle(ran.run_id, created=False, params_hash=""))
    assert handle.result(timeout=5).outputs == ran.outputs
    with pytest.raises(RuntimeError, match="by hand"):
        RunHandle(ran.run_id, created=False, params_hash="").result()


def test_a_failed_run_is_a_typed_error() -> None:
    world = InMemoryWorld()
    with pytest.raises(TerminalToolError):
        world.runner().run(_flow(fail=True), {"text": "hi"})
    [run_id] = world.log.run_ids()
    with pytest.raises(RunFailed, match="declined") as err:
        RunOutcomes(world.log, world.artifacts).result(run_id, timeout=5)
    assert err.value.run_id == run_id and err.value.retryable is False


def test_blocked_and_cancelled_runs_are_typed_errors() -> None:
    world = InMemoryWorld()
    ran = world.runner().run(_flow(), {"text": "hi"})
    state = world.state(ran.run_id)
    assert state is not None
    outcomes = RunOutcomes(world.log, world.artifacts)
    blocked = dataclasses.replace(state, status=RunStatus.BLOCKED, last_error=ErrorInfo("diverged", "call x"))
    with pytest.raises(ResumeBlocked, match="call x"):
        outcomes.outcome(blocked)
    cancelled = dataclasses.replace(state, status=RunStatus.CANCELLED,
                                    last_error=ErrorInfo("cancel", "by ops"))
    with pytest.raises(RunCancelled, match="by ops"):
        outcomes.outcome(cancelled)


def test_a_run_that_goes_on_times_out_and_one_that_ends_later_is_awaited() -> None:
    world = InMemoryWorld()
    run_id, _ = world.crash(_flow(), {"text": "hi"}, at="before:STAGE_STARTED:pay")
    outcomes = RunOutcomes(world.log, world.artifacts, poll_s=(0.01, 0.05))
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="RUNNING"):
        outcomes.result(run_id, timeout=0.3)
    assert 0.3 <= time.monotonic() - t0 < 2
    later = threading.Timer(0.3, lambda: world.resume(run_id))  # a resumer elsewhere, a bit later
    later.start()
    try:
        assert outcomes.result(run_id, timeout=10).outputs["pay"] == {"paid": True}
    finally:
        later.join()


def test_a_projection_that_stays_behind_does_not_keep_the_waiter_waiting() -> None:
    world = InMemoryWorld()
    ran = world.runner().run(_flow(), {"text": "hi"})
    state = world.state(ran.run_id)
    assert state is not None
    stale = dataclasses.replace(state, status=RunStatus.RUNNING)  # a projector that stopped
    outcomes = RunOutcomes(world.log, world.artifacts, projected=lambda run_id: stale, log_every_s=0.2,
                           poll_s=(0.01, 0.05))
    t0 = time.monotonic()
    assert outcomes.result(ran.run_id, timeout=10).completed
    assert 0.2 <= time.monotonic() - t0 < 3
