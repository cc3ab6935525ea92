"""A patch inside a stage (``ctx.patched``) on the real broker and Redis: a run recorded on the code
before the patch, crashed in the middle of its stage, is resumed by the resumer on the patched code
and replays its old calls without divergence; a new run takes the new branch; a run that took the
patch and crashed takes it again on resume.

One workflow version and definition, two codes of its stage ``work``: ``lookup`` (position 0), then
``legacy`` (the old code) or, behind ``ctx.patched("fix-123")``, ``fixed``, then ``lookup`` again. A
run "crashes" after its second call (:class:`~tests.integration.resume._toy.Abandon`, its lease left
to expire), as the toy Apps do. ``Patched.calls`` counts every real tool execution.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest

from runlog.processors.audit import AuditOptions, audit
from runlog.processors.demo.run import wait_lease_gone
from runlog.processors.resume import App, Resumer
from runlog.producers import CallInfo, DictInputSource, Runner, StageContext, Tool, Workflow, rule, tool
from runlog.schemas import EventType, ReplayPolicy, RunEvent, Settings
from tests.integration.resume._toy import Abandon
from tests.integration.resume.conftest import accepted, log_of

pytestmark = pytest.mark.integration

PATCH = "fix-123"


@dataclass
class Patched:
    """The tools, both codes of the workflow, and what ran: tool executions and stage outputs."""

    tools: tuple[Tool, Tool, Tool]
    calls: Counter[str] = field(default_factory=Counter)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    crashing: bool = False

    def workflow(self, *, patched: bool) -> Workflow:
        lookup, legacy, fixed = self.tools
        wf = Workflow("patched_orders", "1")  # the patch needs no new version: the definition is the same

        @wf.stage("work", rules=[rule("b.set", lambda o: bool(o.get("b")))])
        def work(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
            a = ctx.call(lookup, q=ctx.params["order"])["v"]
            b = ctx.call(fixed if patched and ctx.patched(PATCH) else legacy, q=a)["v"]
            if self.crashing:
                raise Abandon("crashed in the middle of work")
            out = {"a": a, "b": b, "c": ctx.call(lookup, q=b)["v"]}
            self.outputs.append(out)
            return out

        @wf.stage("finish")
        def finish(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
            return {"done": ctx.output_of("work")["c"]}

        return wf

    def app(self, *, patched: bool) -> App:
        return App.of([self.workflow(patched=patched)], list(self.tools), DictInputSource({}))


@pytest.fixture
def pt() -> Patched:
    calls: Counter[str] = Counter()

    @tool("po_lookup", policy=ReplayPolicy.SAFE)
    def lookup(call: CallInfo, q: str) -> dict[str, Any]:
        calls["lookup"] += 1
        return {"v": q.upper()}

    @tool("po_legacy", policy=ReplayPolicy.SAFE)
    def legacy(call: CallInfo, q: str) -> dict[str, Any]:
        calls["legacy"] += 1
        return {"v": f"old-{q}"}

    @tool("po_fixed", policy=ReplayPolicy.SAFE)
    def fixed(call: CallInfo, q: str) -> dict[str, Any]:
        calls["fixed"] += 1
        return {"v": f"new-{q}"}

    return Patched((lookup, legacy, fixed), calls)


def _crash(settings: Settings, pt: Patched, *, patched: bool, order: str) -> str:
    """Start a run on one code, crash it after the stage's second call; its id, once its lease is gone."""
    pt.crashing = True
    runner = Runner.from_settings(settings, source=DictInputSource({}))
    try:
        h = runner.start_run(pt.workflow(patched=patched), {"order": order})
        assert h.session is not None
        with pytest.raises(Abandon):
            runner.execute(h.session, release=False)
    finally:
        runner.close()  # stops the heartbeat: the lease expires after its ttl
        pt.crashing = False
    wait_lease_gone(settings, h.run_id, settings.lease_ttl_ms / 1000 * 4)
    return h.run_id


def _events(settings: Settings, run_id: str) -> list[RunEvent]:
    return [le.event for le in accepted(log_of(settings, run_id))]


def _called(events: list[RunEvent]) -> list[str]:
    return [e.call_id or "" for e in events if e.type is EventType.TOOL_CALLED]


def _findings(settings: Settings, run_id: str) -> list[str]:
    report = audit(settings, AuditOptions(run_id=run_id, check_artifacts=False), progress=None)
    return [f.kind for f in report.findings if f.run_id == run_id]


def test_an_old_run_replays_without_divergence_and_a_new_run_takes_the_new_branch(
        topics: Settings, pt: Patched) -> None:
    old = _crash(topics, pt, patched=False, order="o-old")
    assert _called(_events(topics, old)) == ["work/po_lookup/0", "work/po_legacy/1"]
    assert pt.calls == Counter({"lookup": 1, "legacy": 1})

    with Resumer(topics, pt.app(patched=True)) as r:
        out = r.resume(old)
    assert out.result == "completed", out
    events = _events(topics, old)
    assert EventType.CALL_DIVERGED not in [e.type for e in events]
    assert events[-1].type is EventType.RUN_COMPLETED
    # the old branch: its recorded call reused, the new one never made, no marker; the call after
    # the patch check kept the position the old code gives it
    assert pt.outputs == [{"a": "O-OLD", "b": "old-O-OLD", "c": "OLD-O-OLD"}]
    assert pt.calls == Counter({"lookup": 2, "legacy": 1})
    assert _called(events) == ["work/po_lookup/0", "work/po_legacy/1", "work/po_lookup/2"]
    assert "diverged" not in _findings(topics, old)

    # a new run on the patched code takes the new branch and records the marker where it was asked
    with Runner.from_settings(topics, source=DictInputSource({})) as runner:
        new = runner.run(pt.workflow(patched=True), {"order": "o-new"})
    assert new.completed and new.outputs["work"]["b"] == "new-O-NEW"
    assert pt.calls["fixed"] == 1 and pt.calls["legacy"] == 1
    assert _called(_events(topics, new.run_id)) == [
        "work/po_lookup/0", "work/runlog.patched/1", "work/po_fixed/2", "work/po_lookup/3"]


def test_a_run_that_took_the_patch_takes_it_again_after_a_crash(topics: Settings, pt: Patched) -> None:
    run_id = _crash(topics, pt, patched=True, order="o-p")
    assert _called(_events(topics, run_id)) == ["work/po_lookup/0", "work/runlog.patched/1",
                                                "work/po_fixed/2"]
    assert pt.calls == Counter({"lookup": 1, "fixed": 1})

    with Resumer(topics, pt.app(patched=True)) as r:
        out = r.resume(run_id)
    assert out.result == "completed", out
    events = _events(topics, run_id)
    assert EventType.CALL_DIVERGED not in [e.type for e in events]
    assert pt.outputs == [{"a": "O-P", "b": "new-O-P", "c": "NEW-O-P"}]
    assert pt.calls == Counter({"lookup": 2, "fixed": 1})  # the marker and the new call reused
    assert _called(events) == ["work/po_lookup/0", "work/runlog.patched/1", "work/po_fixed/2",
                               "work/po_lookup/3"]
    assert "diverged" not in _findings(topics, run_id)
