"""Child runs (``ctx.start_child``, ``ctx.gather``) in the in-memory world: fan-out and fan-in, the links
on both logs, typed outcomes, and crashes of the parent after starting a child and around the wake-up."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runlog import (
    App,
    AsyncStageContext,
    CallInfo,
    DictInputSource,
    ReplayPolicy,
    StageContext,
    Workflow,
    tool,
)
from runlog.producers.internal import child_key, run_id_for_key
from runlog.projections import RunStatus
from runlog.schemas import EventType, RunCancelled, RunFailed
from runlog.schemas.errors import TerminalToolError
from runlog.testing import InMemoryWorld

N = 5


@tool("double", policy=ReplayPolicy.SAFE)
def double(call: CallInfo, n: int) -> dict[str, Any]:
    if n < 0:
        raise TerminalToolError(f"negative: {n}", kind="Negative")
    return {"n": 2 * n}


child = Workflow("child", version="1")


@child.stage("work")
def work(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
    return {"n": ctx.call(double, n=ctx.params["n"])["n"]}


parent = Workflow("parent", version="1")


@parent.stage("fan")
def fan(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
    handles = [ctx.start_child(child, {"n": i}, key=f"item-{i}") for i in range(ctx.params["count"])]
    results = ctx.gather(*handles)
    return {"total": sum(r.outputs["work"]["n"] for r in results),
            "children": [r.run_id for r in results]}


@parent.stage("after")
def after(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
    return {"seen": ctx.output_of("fan")["total"]}


careful = Workflow("careful", version="1")


@careful.stage("one")
def one(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
    handle = ctx.start_child(child, {"n": ctx.params["n"]})
    try:
        return {"n": handle.result().outputs["work"]["n"]}
    except RunFailed as err:
        return {"failed": err.kind}


aparent = Workflow("aparent", version="1")


@aparent.stage("fan")
async def afan(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
    first = await ctx.start_child(child, {"n": 1})
    rest = [await ctx.start_child(child, {"n": n}) for n in (2, 3)]
    one = await first
    others = await ctx.gather(*rest)
    return {"total": one.outputs["work"]["n"] + sum(r.outputs["work"]["n"] for r in others)}


APP = App.of([parent, child, careful, aparent], [double], DictInputSource({}))


def _output(world: InMemoryWorld, run_id: str, stage: str) -> Any:
    state = world.state(run_id)
    assert state is not None
    return json.loads(world.artifacts.get(state.stage_outputs[stage]))


def test_fan_out_and_gather() -> None:
    world = InMemoryWorld(APP)
    first = world.run(parent, {"count": N})
    assert first.waiting == "runlog.child" and not first.completed  # let go: no lease, no thread
    state = world.state(first.run_id)
    assert state is not None and state.status is RunStatus.WAITING
    assert len(state.children) == N and state.waiting is not None and set(state.waiting.children) == \
        set(state.children)
    lease = world.runner("another").leases.acquire(first.run_id, epoch=state.epoch)  # nobody holds it
    lease.release()
    world.serve()
    done = world.state(first.run_id)
    assert done is not None and done.status is RunStatus.COMPLETED, done
    assert done.waiting is None
    assert _output(world, first.run_id, "fan")["total"] == sum(2 * i for i in range(N))
    assert _output(world, first.run_id, "after") == {"seen": sum(2 * i for i in range(N))}
    assert world.executions()["double"] == N  # every child's call once
    for i, child_id in enumerate(done.children):
        c = world.state(child_id)
        assert c is not None and c.status is RunStatus.COMPLETED
        assert c.parent_run_id == first.run_id and c.parent_call == f"fan/runlog.child/{i}"
        assert child_id == run_id_for_key(child_key(first.run_id, f"fan/runlog.child/{i}", f"item-{i}"))
    called = [e for e in world.events(first.run_id) if e.type is EventType.TOOL_CALLED]
    assert [e.attributes["runlog.child_run_id"] for e in called] == list(done.children)


def test_failed_child_is_a_typed_outcome_recorded_once() -> None:
    world = InMemoryWorld(APP)
    res = world.run(careful, {"n": -1})
    world.serve()
    state = world.state(res.run_id)
    assert state is not None and state.status is RunStatus.COMPLETED
    assert _output(world, res.run_id, "one") == {"failed": "Negative"}
    [child_id] = state.children
    c = world.state(child_id)
    assert c is not None and c.status is RunStatus.FAILED
    ends = [e for e in world.events(res.run_id) if e.call_id == "one/runlog.child/0"
            and e.type in (EventType.TOOL_RESULT, EventType.SIGNAL_RECEIVED)]
    assert len(ends) == 1 and ends[0].attributes["status"] == "FAILED"


def test_uncaught_child_failure_fails_the_parent_stage() -> None:
    world = InMemoryWorld(APP)
    res = world.run(parent, {"count": 0})
    assert res.completed  # no children: nothing to wait for
    bad = Workflow("bad", version="1")

    @bad.stage("s")
    def s(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"n": ctx.start_child(child, {"n": -5}).result().run_id}

    world2 = InMemoryWorld(App.of([bad, child], [double], DictInputSource({})))
    r2 = world2.run(bad, {})
    world2.serve()
    st = world2.state(r2.run_id)
    assert st is not None and st.status is RunStatus.FAILED
    [child_id] = st.children
    assert st.last_error is not None and st.last_error.kind == "Negative"  # the child's error, named
    assert child_id in st.last_error.message


def test_async_stage_awaits_children() -> None:
    world = InMemoryWorld(APP)
    res = world.run(aparent, {})
    world.serve()
    state = world.state(res.run_id)
    assert state is not None and state.status is RunStatus.COMPLETED
    assert _output(world, res.run_id, "fan") == {"total": 12}
    assert len(state.children) == 3


@pytest.mark.parametrize("at", ["before:CHILD", "after:CHILD", "after:TOOL_CALLED"])
def test_parent_crash_around_a_child_start_starts_each_child_once(at: str) -> None:
    world = InMemoryWorld(APP)
    run_id, point = world.crash(parent, {"count": 3}, at=at)
    outcome = world.resume(run_id)  # the parent again: finds the children it started, starts the rest
    assert outcome.result == "waiting", outcome
    world.serve()
    state = world.state(run_id)
    assert state is not None and state.status is RunStatus.COMPLETED, (point, state)
    assert len(state.children) == 3
    starts = [r for r in world.log.run_ids() if r != run_id]
    assert sorted(starts) == sorted(state.children)  # no second child for any key
    assert world.executions()["double"] == 3


def test_child_crash_before_waking_its_parent() -> None:
    """The child's process dies after its end, before it asks for its parent's resume: the parent is
    still woken by a resumer that finds all its children ended (the sweep's path)."""
    world = InMemoryWorld(APP)
    res = world.run(careful, {"n": 4})
    [request] = [r for r in world.log.resume_requests if r.run_id != res.run_id]
    from runlog.producers import crash as _crash

    def die(point: str) -> None:
        raise KeyboardInterrupt(point)  # the process is gone: nothing after this point happens

    _crash.on_crash(die)
    _crash.arm("before:WAKE")
    try:
        with pytest.raises(KeyboardInterrupt):
            world.serve()
    finally:
        _crash.arm(None)
        _crash.on_crash(None)
    c = world.state(request.run_id)
    assert c is not None and c.status is RunStatus.COMPLETED
    assert [r.run_id for r in world.log.resume_requests].count(res.run_id) == 0
    outcome = world.resume(res.run_id)  # what the sweep asks for once the children have ended
    assert outcome.result == "completed", outcome
    assert _output(world, res.run_id, "one") == {"n": 8}


def test_waiting_parent_is_not_resumed_before_its_children_end() -> None:
    world = InMemoryWorld(APP)
    res = world.run(parent, {"count": 2})
    outcome = world.resume(res.run_id)
    assert outcome.result == "waiting"
    state = world.state(res.run_id)
    assert state is not None and state.status is RunStatus.WAITING and state.epoch == 1


def test_cancelled_child_reaches_the_parent() -> None:
    world = InMemoryWorld(APP)
    res = world.run(careful, {"n": 1})
    [child_id] = world.state(res.run_id).children  # type: ignore[union-attr]
    runner = world.runner("operator")
    session = runner.take_over(child_id, last_seq=world.state(child_id).last_seq,  # type: ignore[union-attr]
                               workflow=child, input_versions={}, params={"n": 1}, epoch=1)
    session.append(EventType.RUN_CANCELLED, confirm=True)
    session.close(release=True)
    world.project()
    outcome = world.resume(res.run_id)
    assert outcome.result == "failed"  # the stage catches RunFailed only: RunCancelled fails it
    state = world.state(res.run_id)
    assert state is not None and state.last_error is not None and state.last_error.kind == "RunCancelled"
    assert RunCancelled.__name__ == "RunCancelled"
