"""Patches inside a stage (``ctx.patched``): new runs take the new branch and record a marker, runs
recorded before the patch replay their old calls without divergence, and a run that took the patch
takes it again on every resume (in-memory adapters, both runners; the stage context alone).

The stage of :func:`workflow` calls ``lookup`` (position 0), then ``legacy`` (the old code) or,
behind ``ctx.patched("fix-123")``, ``fixed``, then ``lookup`` again. A run "crashes" by raising
:class:`Crash` (a BaseException: no ``FAILED``, the session flushed) at a named point.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from runlog.producers import AsyncStageContext, CallInfo, Diverged, StageContext, Workflow, rule, tool
from runlog.producers.calls._artifacts import InMemoryArtifactStore
from runlog.producers.calls._calls import RecordedCall, StageOutputs
from runlog.producers.calls._keys import canonical_json, sha256_hex
from runlog.projections import RunStatus
from runlog.projections.fold import fold_all
from runlog.schemas import EventType, ReplayPolicy, RunEvent, WorkflowDefinitionError
from tests.unit.producers._replay import MemoryWorld, again_async
from tests.unit.producers.test_guard_and_ledger import FakeSession

T = EventType
PATCH = "fix-123"


class Crash(BaseException):
    """Stops a run in the middle of its stage, like a crash."""


class World(MemoryWorld):
    """The in-memory adapters, what the tools really did, and where the next run crashes."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.crash_at: str | None = None

        @tool("lookup", policy=ReplayPolicy.SAFE)
        def lookup(call: CallInfo, q: str) -> dict[str, Any]:
            self.calls.append(f"lookup:{q}")
            return {"v": q.upper()}

        @tool("legacy", policy=ReplayPolicy.SAFE)
        def legacy(call: CallInfo, q: str) -> dict[str, Any]:
            self.calls.append(f"legacy:{q}")
            self.crash("in legacy")
            return {"v": "old"}

        @tool("fixed", policy=ReplayPolicy.SAFE)
        def fixed(call: CallInfo, q: str) -> dict[str, Any]:
            self.calls.append(f"fixed:{q}")
            self.crash("in fixed")
            return {"v": "new"}

        self.lookup, self.legacy, self.fixed = lookup, legacy, fixed

    def crash(self, point: str) -> None:
        if self.crash_at == point:
            self.crash_at = None
            raise Crash(point)

    def workflow(self, *, patched: bool) -> Workflow:
        """The workflow before the patch (``patched=False``) or with it: one version, one definition."""
        wf = Workflow("article", "1")
        lookup, legacy, fixed = self.lookup, self.legacy, self.fixed

        @wf.stage("work", rules=[rule("three", lambda o: len(o) == 3)])
        def work(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
            a = ctx.call(lookup, q="a")["v"]
            self.crash("after a")
            if patched and ctx.patched(PATCH):
                b = ctx.call(fixed, q="b")["v"]
            else:
                b = ctx.call(legacy, q="b")["v"]
            self.crash("after b")
            c = ctx.call(lookup, q="c")["v"]
            self.crash("after c")
            return {"a": a, "b": b, "c": c}

        return wf

    def start(self, wf: Workflow, crash_at: str | None = None) -> str:
        """Run ``wf``, crashed at ``crash_at`` (None: to completion); the run id."""
        self.crash_at = crash_at
        if crash_at is None:
            return self.runner.run(wf, {}).run_id
        known = set(self.log.run_ids())
        with pytest.raises(Crash):
            self.runner.run(wf, {})
        return self.new_run(known)

    def new_run(self, known: set[str]) -> str:
        """The one run started since the run ids ``known`` were read."""
        (run_id,) = set(self.log.run_ids()) - known
        return run_id

    def resume(self, run_id: str, wf: Workflow) -> Any:
        return self.again(run_id, wf, {}, recorded_calls=self.recorded(run_id))

    def calls_of(self, run_id: str) -> list[str]:
        return [e.call_id or "" for e in self.events(run_id) if e.type is T.TOOL_CALLED]


@pytest.fixture
def world() -> Iterator[World]:
    w = World()
    yield w
    w.runner.close()


def _settled(events: list[RunEvent]) -> None:
    state = fold_all(events)
    assert state is not None and state.status is RunStatus.COMPLETED and state.rejected_total == 0
    assert T.CALL_DIVERGED not in [e.type for e in events]


# -- a new run ---------------------------------------------------------------------------------------


def test_a_new_run_takes_the_new_branch_and_records_the_marker_at_its_position(world: World) -> None:
    res = world.runner.run(world.workflow(patched=True), {})
    assert res.completed and res.outputs["work"] == {"a": "A", "b": "new", "c": "C"}
    assert world.calls == ["lookup:a", "fixed:b", "lookup:c"]
    assert world.calls_of(res.run_id) == ["work/lookup/0", "work/runlog.patched/1", "work/fixed/2",
                                          "work/lookup/3"]
    marker = next(e for e in world.events(res.run_id) if e.call_id == "work/runlog.patched/1")
    assert marker.request_hash == sha256_hex(canonical_json({"patch": PATCH}))
    result = next(e for e in world.events(res.run_id)
                  if e.type is T.TOOL_RESULT and e.call_id == "work/runlog.patched/1")
    assert result.payload_ref is not None and world.store.get(result.payload_ref) == b"true"
    _settled(world.events(res.run_id))


# -- a run recorded before the patch ----------------------------------------------------------------


@pytest.mark.parametrize("point", ["after b", "after c", "in legacy"])
def test_an_old_run_replays_its_old_calls_without_divergence(world: World, point: str) -> None:
    run_id = world.start(world.workflow(patched=False), crash_at=point)
    before = world.calls_of(run_id)
    assert "work/legacy/1" in before and "work/runlog.patched/1" not in before
    world.calls.clear()
    res = world.resume(run_id, world.workflow(patched=True))
    assert res.completed and res.outputs["work"] == {"a": "A", "b": "old", "c": "C"}
    # nothing recorded is called again (a legacy call without a result runs again, as any call would)
    assert "fixed:b" not in world.calls and "lookup:a" not in world.calls
    expected = {"after b": ["lookup:c"], "after c": [], "in legacy": ["legacy:b", "lookup:c"]}
    assert world.calls == expected[point]
    # the positions are those of the old run: patched() took none and recorded nothing
    assert [c for c in world.calls_of(run_id) if "patched" in c] == []
    assert "work/lookup/2" in world.calls_of(run_id)
    _settled(world.events(run_id))


def test_an_old_run_crashed_before_the_patch_position_takes_the_new_branch(world: World) -> None:
    """Nothing recorded at or past the patch's position: the run reaches it on the new code."""
    run_id = world.start(world.workflow(patched=False), crash_at="after a")
    world.calls.clear()
    res = world.resume(run_id, world.workflow(patched=True))
    assert res.outputs["work"] == {"a": "A", "b": "new", "c": "C"}
    assert world.calls == ["fixed:b", "lookup:c"]
    assert "work/runlog.patched/1" in world.calls_of(run_id)
    _settled(world.events(run_id))


def test_without_the_patch_check_the_same_resume_diverges(world: World) -> None:
    """The control: replacing the old call with the new one outright blocks the old run."""
    run_id = world.start(world.workflow(patched=False), crash_at="after b")
    wf = Workflow("article", "1")
    lookup, fixed = world.lookup, world.fixed

    @wf.stage("work", rules=[rule("three", lambda o: len(o) == 3)])
    def work(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"a": ctx.call(lookup, q="a")["v"], "b": ctx.call(fixed, q="b")["v"],
                "c": ctx.call(lookup, q="c")["v"]}

    with pytest.raises(Diverged):
        world.resume(run_id, wf)
    assert [e.type for e in world.events(run_id)][-2:] == [T.CALL_DIVERGED, T.RUN_BLOCKED]


# -- a run that took the patch ------------------------------------------------------------------------


@pytest.mark.parametrize("point", ["in fixed", "after b", "after c"])
def test_a_run_that_took_the_patch_takes_it_again_after_a_crash(world: World, point: str) -> None:
    wf = world.workflow(patched=True)
    run_id = world.start(wf, crash_at=point)
    assert "work/runlog.patched/1" in world.calls_of(run_id)
    n = len(world.calls_of(run_id))
    world.calls.clear()
    res = world.resume(run_id, wf)
    assert res.outputs["work"] == {"a": "A", "b": "new", "c": "C"}
    assert "legacy:b" not in world.calls
    assert world.calls == {"in fixed": ["fixed:b", "lookup:c"], "after b": ["lookup:c"], "after c": []}[point]
    # the marker is reused (nothing appended for it); only calls that had no result are recorded anew
    new = world.calls_of(run_id)[n:]
    assert "work/runlog.patched/1" not in new
    _settled(world.events(run_id))
    # and once more, now that the whole stage is recorded: the same answer, nothing called
    world.calls.clear()
    again = world.resume(run_id, wf)
    assert again.outputs == res.outputs and world.calls == []


# -- the async runner ---------------------------------------------------------------------------------


def _async_workflow(w: World, *, patched: bool) -> Workflow:
    wf = Workflow("article", "1")
    lookup, legacy, fixed = w.lookup, w.legacy, w.fixed

    @wf.stage("work", rules=[rule("three", lambda o: len(o) == 3)])
    async def work(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        a = (await ctx.call(lookup, q="a"))["v"]
        if patched and await ctx.patched(PATCH):
            b = (await ctx.call(fixed, q="b"))["v"]
        else:
            b = (await ctx.call(legacy, q="b"))["v"]
        w.crash("after b")
        return {"a": a, "b": b, "c": (await ctx.call(lookup, q="c"))["v"]}

    return wf


def test_the_async_form_records_and_replays_the_same_way(world: World) -> None:
    aio = world.async_runner()
    new = asyncio.run(aio.run(_async_workflow(world, patched=True), {}))
    assert new.outputs["work"]["b"] == "new"
    assert world.calls_of(new.run_id) == ["work/lookup/0", "work/runlog.patched/1", "work/fixed/2",
                                          "work/lookup/3"]

    world.crash_at = "after b"
    known = set(world.log.run_ids())
    with pytest.raises(Crash):
        asyncio.run(aio.run(_async_workflow(world, patched=False), {}))
    old = world.new_run(known)
    world.calls.clear()
    res = asyncio.run(again_async(aio, world.events(old), _async_workflow(world, patched=True), {},
                                  recorded_calls=world.recorded(old)))
    assert res.outputs["work"] == {"a": "A", "b": "old", "c": "C"} and world.calls == ["lookup:c"]
    _settled(world.events(old))

    world.calls.clear()
    again = asyncio.run(again_async(aio, world.events(new.run_id), _async_workflow(world, patched=True), {},
                                    recorded_calls=world.recorded(new.run_id)))
    assert again.outputs == new.outputs and world.calls == []


# -- the stage context alone ----------------------------------------------------------------------------


def _ctx(tmp_store: InMemoryArtifactStore, session: FakeSession,
         recorded: dict[str, RecordedCall] | None = None) -> StageContext:
    return StageContext(session, "s", tmp_store, StageOutputs(tmp_store, {}),  # type: ignore[arg-type]
                        recorded_calls=recorded or {}, reconciled={})


def _marker(patch: str, index: int, result: Any = None) -> RecordedCall:
    return RecordedCall(f"s/runlog.patched/{index}", "runlog.patched",
                        sha256_hex(canonical_json({"patch": patch})), result)


def _rec(tool_name: str, index: int) -> RecordedCall:
    return RecordedCall(f"s/{tool_name}/{index}", tool_name, "0" * 64)


def test_a_patch_is_decided_once_per_stage_and_recorded_once() -> None:
    s, store = FakeSession(), InMemoryArtifactStore()
    ctx = _ctx(store, s)
    assert ctx.patched("p") and ctx.patched("p")
    assert [f["call_id"] for t, f in s.events if t is T.TOOL_CALLED] == ["s/runlog.patched/0"]
    old = FakeSession()
    ctx2 = _ctx(store, old, {"s/x/0": _rec("x", 0)})
    assert not ctx2.patched("p") and not ctx2.patched("p")
    assert old.events == []


def test_the_marker_of_another_patch_at_the_position_means_not_this_one() -> None:
    """Code with patches ``a`` then ``b`` replaying a run recorded when only ``b`` existed."""
    s, store = FakeSession(), InMemoryArtifactStore()
    ref = store.put(b"true", "application/json")
    ctx = _ctx(store, s, {"s/runlog.patched/0": _marker("b", 0, ref)})
    assert ctx.patched("a") is False
    assert ctx.patched("b") is True
    assert s.events == []  # the recorded marker of b is reused


def test_a_marker_recorded_without_its_result_is_taken_and_recorded_again() -> None:
    s, store = FakeSession(), InMemoryArtifactStore()
    ctx = _ctx(store, s, {"s/runlog.patched/0": _marker("p", 0), "s/fixed/1": _rec("fixed", 1)})
    assert ctx.patched("p") is True
    assert [(t, f["call_id"]) for t, f in s.events] == [(T.TOOL_CALLED, "s/runlog.patched/0"),
                                                       (T.TOOL_RESULT, "s/runlog.patched/0")]


def test_a_gap_in_the_recorded_positions_is_recorded_territory() -> None:
    """A concurrent call submitted at the position was not recorded, a later one was: the run was
    past this point on the old code, so the patch is not taken (and the position stays free)."""
    s, store = FakeSession(), InMemoryArtifactStore()
    ctx = _ctx(store, s, {"s/x/1": _rec("x", 1)})
    assert ctx.patched("p") is False and ctx.positions.claim() == 0


def test_a_patch_needs_an_id() -> None:
    ctx = _ctx(InMemoryArtifactStore(), FakeSession())
    with pytest.raises(WorkflowDefinitionError):
        ctx.patched("")


def test_another_call_with_the_markers_request_is_not_the_marker() -> None:
    """A recorded call of another tool at the position keeps the patch off, whatever its request."""
    s, store = FakeSession(), InMemoryArtifactStore()
    ctx = _ctx(store, s, {"s/other/0": RecordedCall("s/other/0", "other",
                                                    sha256_hex(canonical_json({"patch": "p"})))})
    assert ctx.patched("p") is False and s.events == []
