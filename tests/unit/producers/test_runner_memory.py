"""The Runner and the determinism guard on the in-memory adapters (no broker, no Redis).

Every run's events are folded with the same pure fold the projector uses, so an
event the fold would reject fails the test.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from runlog.producers.calls._keys import delivery_key
from runlog.producers.calls._ledger import LedgerEntry
from runlog.producers.define._inputs import DictInputSource
from runlog.producers.define._tools import CallInfo, Tool, tool
from runlog.producers.define._workflow import Workflow, rule
from runlog.producers.run._context import StageContext
from runlog.projections import RunStatus
from runlog.projections.fold import fold_all
from runlog.schemas import Diverged, EffectInDoubt, EffectStatus, EventType, ReplayPolicy, RunEvent
from runlog.schemas._hash import event_hash
from runlog.schemas.errors import VerificationFailed
from tests.unit.producers._replay import MemoryWorld

T = EventType
SOURCE = DictInputSource({"facts": {"v1": {"claims": ["a", "b"]}}})


class World(MemoryWorld):
    """The in-memory adapters, and counts of what tools really did."""

    def __init__(self) -> None:
        super().__init__(SOURCE, max_parallel=2)
        self.calls: list[str] = []

    def types(self, run_id: str) -> list[EventType]:
        return [e.type for e in self.events(run_id)]

    def tools(self) -> tuple[Tool, Tool]:
        @tool("search", policy=ReplayPolicy.SAFE)
        def search(call: CallInfo, q: str) -> dict[str, Any]:
            self.calls.append(f"search:{q}")
            return {"hits": [q.upper(), f"{q}-2"]}

        @tool("upload", policy=ReplayPolicy.IDEMPOTENT, effect=True, target="cdn:assets",
              delivery=lambda a, c: ("acct", "cdn", a["name"], "1"))
        def upload(call: CallInfo, name: str) -> dict[str, Any]:
            self.calls.append(f"upload:{name}")
            assert call.idempotency_key
            return {"external_id": f"asset-{name}"}

        return search, upload

    def workflow(self) -> Workflow:
        search, upload = self.tools()
        wf = Workflow("article", "1")

        @wf.stage("research", inputs=["facts"], rules=[rule("has hits", lambda o: len(o["hits"]) == 2)])
        def research(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
            assert inputs["facts"] == {"claims": ["a", "b"]}
            return {"hits": ctx.call(search, q=ctx.params["topic"])["hits"]}

        @wf.stage("publish")
        def publish(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
            hits = ctx.output_of("research")["hits"]
            return {"asset": ctx.call(upload, name=hits[0])["external_id"]}

        return wf


@pytest.fixture
def world() -> Iterator[World]:
    w = World()
    yield w
    w.runner.close()


def _check_chain(events: list[RunEvent]) -> None:
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    for a, b in itertools.pairwise(events):
        assert b.prev_hash == event_hash(a)


def test_a_run_completes_with_the_expected_events(world: World) -> None:
    wf = world.workflow()
    res = world.runner.run(wf, {"topic": "kafka"})
    assert res.completed and res.epoch == 1 and res.waiting is None
    assert res.outputs == {"research": {"hits": ["KAFKA", "kafka-2"]}, "publish": {"asset": "asset-KAFKA"}}
    assert world.types(res.run_id) == [
        T.RUN_STARTED,
        T.STAGE_STARTED, T.TOOL_CALLED, T.TOOL_RESULT, T.VERIFIED,
        T.STAGE_STARTED, T.TOOL_CALLED, T.EFFECT_INTENT, T.EFFECT_RESULT, T.TOOL_RESULT, T.VERIFIED,
        T.RUN_COMPLETED,
    ]
    evs = world.events(res.run_id)
    _check_chain(evs)
    assert res.last_seq == len(evs) and {e.epoch for e in evs} == {1}
    assert evs[0].input_versions == {"facts": "v1"} and evs[0].attributes["writer"] == "w-test"
    state = fold_all(evs)
    assert state is not None and state.status is RunStatus.COMPLETED and state.rejected_total == 0
    for e in evs:  # every referenced artifact is in the store, intact
        for ref in (e.payload_ref, *e.artifact_refs):
            if ref is not None:
                world.store.verify(ref)
    dk = evs[7].delivery_key
    assert dk is not None
    done = world.ledger.lookup(dk)
    assert done is not None and done.done and done.external_id == "asset-KAFKA"
    assert world.table.held == {}  # the lease was released
    assert world.calls == ["search:kafka", "upload:KAFKA"]


def test_recorded_calls_are_reused_without_calling_tools(world: World) -> None:
    wf = world.workflow()
    first = world.runner.run(wf, {"topic": "kafka"})
    n = len(world.events(first.run_id))
    recorded = world.recorded(first.run_id)
    assert set(recorded) == {"research/search/0", "publish/upload/0"}
    res = world.again(first.run_id, wf, {"topic": "kafka"}, recorded_calls=recorded)
    assert res.completed and res.epoch == 2 and res.outputs == first.outputs
    assert world.calls == ["search:kafka", "upload:KAFKA"]  # nothing called twice
    tail = world.events(first.run_id)[n:]
    assert [e.type for e in tail] == [T.LEASE_ACQUIRED, T.STAGE_STARTED, T.VERIFIED, T.STAGE_STARTED,
                                      T.VERIFIED, T.RUN_COMPLETED]
    assert {e.epoch for e in tail} == {2}
    state = fold_all(world.events(first.run_id))
    assert state is not None and state.status is RunStatus.COMPLETED and state.rejected_total == 0


def test_a_changed_argument_diverges_and_blocks_the_run(world: World) -> None:
    wf = world.workflow()
    first = world.runner.run(wf, {"topic": "kafka"})
    n = len(world.events(first.run_id))
    with pytest.raises(Diverged) as info:
        world.again(first.run_id, wf, {"topic": "redis"}, recorded_calls=world.recorded(first.run_id))
    assert info.value.run_id == first.run_id
    assert world.calls == ["search:kafka", "upload:KAFKA"]  # the recorded result was not handed back
    tail = world.events(first.run_id)[n:]
    assert [e.type for e in tail] == [T.LEASE_ACQUIRED, T.STAGE_STARTED, T.CALL_DIVERGED, T.RUN_BLOCKED]
    div = tail[2]
    assert div.call_id == "research/search/0"
    assert div.attributes["recorded_request_hash"] != div.request_hash
    state = fold_all(world.events(first.run_id))
    assert state is not None and state.status is RunStatus.BLOCKED
    assert world.table.held == {}


def test_another_tool_at_a_recorded_position_diverges(world: World) -> None:
    wf = world.workflow()
    first = world.runner.run(wf, {"topic": "kafka"})
    other = Workflow("article", "1")

    @tool("lookup")
    def lookup(call: CallInfo, q: str) -> dict[str, Any]:
        world.calls.append("lookup")
        return {"hits": [q, q]}

    other.stage("research")(lambda ctx, inputs: {"hits": ctx.call(lookup, q="kafka")["hits"]})
    with pytest.raises(Diverged):
        world.again(first.run_id, other, {"topic": "kafka"}, recorded_calls=world.recorded(first.run_id))
    assert "lookup" not in world.calls
    assert world.types(first.run_id)[-2:] == [T.CALL_DIVERGED, T.RUN_BLOCKED]


def test_a_never_effect_open_in_another_run_is_in_doubt(world: World) -> None:
    charged: list[str] = []

    @tool("charge", policy=ReplayPolicy.NEVER, target="bank:cards",
          delivery=lambda a, c: ("acct", "bank", a["order"], "1"))
    def charge(call: CallInfo, order: str) -> dict[str, Any]:
        charged.append(order)
        return {"external_id": f"ch-{order}"}

    dk = delivery_key("acct", "bank", "o-1", "1")
    assert world.ledger.open(LedgerEntry(dk, "run-other", "pay/charge/0", EffectStatus.INTENT)) is None
    wf = Workflow("pay", "1")
    wf.stage("pay")(lambda ctx, inputs: dict(ctx.call(charge, order="o-1")))
    with pytest.raises(EffectInDoubt) as info:
        world.runner.run(wf, {})
    assert charged == [] and info.value.delivery_key == dk
    run_id = world.log.run_ids()[-1]
    assert world.types(run_id) == [T.RUN_STARTED, T.STAGE_STARTED, T.TOOL_CALLED, T.RUN_BLOCKED]
    entry = world.ledger.lookup(dk)
    assert entry is not None and entry.run_id == "run-other"  # the open claim is left as it was


def test_wait_for_lets_the_run_go_until_its_signal(world: World) -> None:
    wf = Workflow("approve", "1")

    @wf.stage("review")
    def review(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"ok": ctx.wait_for("approval", timeout=60)["ok"]}

    res = world.runner.run(wf, {})
    assert res.waiting == "approval" and not res.completed
    evs = world.events(res.run_id)
    assert [e.type for e in evs] == [T.RUN_STARTED, T.STAGE_STARTED, T.TOOL_CALLED, T.RUN_WAITING]
    assert evs[-1].attributes["signal"] == "approval" and int(evs[-1].attributes["deadline_ms"]) > 0
    assert world.table.held == {}  # no lease held while it waits
    state = fold_all(evs)
    assert state is not None and state.status is RunStatus.WAITING


def test_a_failed_rule_appends_failed_and_raises(world: World) -> None:
    wf = Workflow("bad", "1")
    wf.stage("s", rules=[rule("two", lambda o: o["n"] == 2)])(lambda ctx, inputs: {"n": 1})
    with pytest.raises(VerificationFailed):
        world.runner.run(wf, {})
    run_id = world.log.run_ids()[-1]
    assert world.types(run_id) == [T.RUN_STARTED, T.STAGE_STARTED, T.FAILED]
    state = fold_all(world.events(run_id))
    assert state is not None and state.status is RunStatus.FAILED
