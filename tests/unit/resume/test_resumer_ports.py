"""The Resumer on in-memory ports (event log, projection store, artifact store, lease, ledger): no services.

What the facts reader reads, and whole resumes: from a checkpoint, blocked, contended, unknown."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from runlog.processors.resume import App, Resumer, UnknownRun
from runlog.processors.resume.ports import MemoryRunEvents
from runlog.producers import DictInputSource, StageContext, Tool, Workflow, tool
from runlog.producers.calls._artifacts import InMemoryArtifactStore
from runlog.producers.calls._ledger import InMemoryEffectLedger
from runlog.producers.log._memory import (
    InMemoryEventLog,
    InMemoryLeaseManager,
    InMemoryLeaseTable,
)
from runlog.producers.run._runner import Runner
from runlog.projections import MemoryStore, RunState, RunUpdate, StoredCheckpoint, fold
from runlog.schemas import EventType, ReplayPolicy, Settings


class Crash(BaseException):
    """The worker dies (not a stage failure: nothing is recorded)."""


class World:
    def __init__(self) -> None:
        self.log = InMemoryEventLog(writer_id="w-1")
        self.table = InMemoryLeaseTable()
        self.artifacts = InMemoryArtifactStore()
        self.ledger = InMemoryEffectLedger()
        self.projection = MemoryStore()
        self.calls: list[str] = []
        self.crash_in: str | None = None
        self.runners: list[Runner] = []

    def runner(self, holder: str) -> Runner:
        r = Runner(self.log, InMemoryLeaseManager(self.table, holder=holder), self.artifacts,
                   source=DictInputSource({}), ledger=self.ledger, run_log=self.log)
        self.runners.append(r)
        return r

    def workflow(self) -> Workflow:
        @tool("search", policy=ReplayPolicy.SAFE)
        def search(call: Any, q: str) -> dict[str, Any]:
            self.calls.append(f"search:{q}")
            return {"hits": [q]}

        self.tools: list[Tool] = [search]
        wf = Workflow("article", "1")

        @wf.stage("draft")
        def draft(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
            return {"hits": ctx.call(search, q="draft")["hits"]}

        @wf.stage("publish")
        def publish(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
            hits = ctx.call(search, q="publish")["hits"]
            if self.crash_in == "publish":
                raise Crash
            return {"hits": hits, "draft": ctx.output_of("draft")["hits"]}

        return wf

    def app(self) -> App:
        return App.of([self.workflow()], self.tools, DictInputSource({}))

    def crashed_run(self) -> str:
        self.crash_in = "publish"
        with pytest.raises(Crash):
            self.runner("w-1").run(self.workflow(), {"topic": "t"})
        self.crash_in = None
        (run_id,) = self.log.run_ids()
        self.table.expire(run_id)
        return run_id

    def project(self, run_id: str) -> None:
        """What a projector would have written: the run's state and every checkpoint's snapshot."""
        state: RunState | None = None
        stored: list[StoredCheckpoint] = []
        for rec in self.log.records(run_id):
            state, outcome = fold(state, rec.event, (rec.partition, rec.offset))
            if outcome.checkpoint is not None:
                stored.append(StoredCheckpoint(outcome.checkpoint, state))
        assert state is not None
        self.projection.apply([RunUpdate(state, -1, checkpoints=tuple(stored))])

    def resumer(self) -> Resumer:
        return Resumer(Settings(), self.app(), runner=self.runner("w-2"), artifacts=self.artifacts,
                       projection=self.projection, events=MemoryRunEvents(self.log))


@pytest.fixture
def world() -> Iterator[World]:
    w = World()
    yield w
    for r in w.runners:
        r.close()


def test_a_crashed_run_resumes_from_its_checkpoint_without_calling_done_stages_again(world: World) -> None:
    run_id = world.crashed_run()
    assert world.calls == ["search:draft", "search:publish"]
    with world.resumer() as r:
        out = r.resume(run_id)
    assert out.result == "completed" and out.plan.from_stage == "publish"
    assert out.plan.checkpoint is not None and out.plan.checkpoint.stage == "draft"
    assert list(out.plan.reused_calls) == ["publish/search/0"]  # its result was recorded before the crash
    assert world.calls == ["search:draft", "search:publish"]  # no tool ran again
    types = [e.type for e in world.log.events(run_id)]
    assert EventType.LEASE_ACQUIRED in types and types[-1] is EventType.RUN_COMPLETED


def test_without_a_projection_the_checkpoints_are_read_from_the_log(world: World) -> None:
    run_id = world.crashed_run()
    with world.resumer() as r:
        facts = r.facts(run_id)
    assert facts.events_read == len(world.log.events(run_id))  # folded from the start
    assert [c.checkpoint.stage for c in facts.checks] == ["draft"] and facts.checkpoints_known == 1


def test_with_a_projection_the_newest_checkpoint_and_the_tail_after_it_are_read(world: World) -> None:
    run_id = world.crashed_run()
    world.project(run_id)
    n = len(world.log.events(run_id))
    with world.resumer() as r:
        facts = r.facts(run_id)
    assert len(facts.checks) == 1 and facts.checks[0].problem is None
    # the checkpoint's snapshot plus the events after it, not the run from its start
    assert facts.events_read == n - facts.checks[0].checkpoint.last_seq > 0
    assert facts.state.last_seq == n


def test_a_checkpoint_with_a_corrupt_artifact_blocks_the_run(world: World) -> None:
    run_id = world.crashed_run()
    world.project(run_id)
    with world.resumer() as r:
        facts = r.facts(run_id)
        (ref, *_) = facts.checks[0].checkpoint.artifacts
        world.artifacts.corrupt(ref, b"rot")
        out = r.resume(run_id)
    assert out.result == "blocked" and out.detail.startswith("no checkpoint has intact artifacts")
    assert "ArtifactCorrupt" in out.detail
    assert world.log.events(run_id)[-1].type is EventType.RUN_BLOCKED


def test_a_run_whose_lease_is_held_is_contended_and_nothing_is_appended(world: World) -> None:
    run_id = world.crashed_run()
    InMemoryLeaseManager(world.table, holder="w-alive").acquire(run_id)
    n = len(world.log.events(run_id))
    with world.resumer() as r:
        out = r.resume(run_id)
    assert out.result == "contended" and "w-alive" in out.detail
    assert len(world.log.events(run_id)) == n


def test_a_dry_run_plans_and_changes_nothing(world: World) -> None:
    run_id = world.crashed_run()
    n = len(world.log.events(run_id))
    with world.resumer() as r:
        out = r.resume(run_id, dry_run=True)
    assert (out.result, out.plan.from_stage) == ("planned", "publish")
    assert len(world.log.events(run_id)) == n and world.calls == ["search:draft", "search:publish"]


def test_a_run_nobody_knows_is_unknown(world: World) -> None:
    with world.resumer() as r, pytest.raises(UnknownRun):
        r.resume("run-nobody")
