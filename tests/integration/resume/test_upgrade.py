"""``runlog upgrade`` (issue #25, item 2): a run in flight continues on another version of its workflow.

The orders workflow (pick, pay, notify; version 2 changes notify's text) crashed at the end of a stage
is upgraded to version 2: it continues from its latest checkpoint whose stages version 2 left
unchanged, runs the rest on the new code, and charges once. The dry run's plan is the real one's.
A run blocked because its stage diverged continues on the fixed definition of the same version.
Real broker, Redis and demo world.
"""

from __future__ import annotations

import contextlib
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from runlog.processors.operate import OperatorRefused
from runlog.processors.resume import App, Resumer
from runlog.processors.upgrade import upgrade_run
from runlog.producers import Runner, Workflow, rule
from runlog.projections import RunStatus
from runlog.schemas import EventType, Settings
from tests.integration.resume._orders import orders_app
from tests.integration.resume._toy import Abandon
from tests.integration.resume.conftest import DemoWorld, log_of

pytestmark = pytest.mark.integration


def _crash_at(stage_to_crash: str) -> Any:
    armed = {"on": True}

    def crash(stage: str, params: Any) -> None:
        if armed["on"] and stage == stage_to_crash:
            armed["on"] = False
            raise Abandon(f"crashed at the end of {stage}")
    return crash


def _start_crashed(settings: Settings, app: App, order: str) -> str:
    runner = Runner.from_settings(settings, source=app.source)
    try:
        h = runner.start_run(app.registry.get("orders", "1"), {"order": order, "mode": "ctx"})
        assert h.session is not None
        with contextlib.suppress(Abandon):
            runner.execute(h.session, release=False)
    finally:
        runner.close()
    return h.run_id


@pytest.mark.parametrize("crash_stage", ["pick", "pay", "notify"])
def test_an_upgrade_at_a_stage_boundary_reruns_only_what_changed_and_charges_once(
        topics: Settings, world: DemoWorld, tmp_path: Path, crash_stage: str) -> None:
    from runlog.processors.demo.run import wait_lease_gone

    v1 = orders_app(world.client, crash=_crash_at(crash_stage))
    run_id = _start_crashed(topics, v1, f"u-{crash_stage}")
    wait_lease_gone(topics, run_id, 10)
    both = orders_app(world.client, versions=("1", "2"))
    dry = upgrade_run(topics, both, run_id, "2", by="ops", reason="notify text", dry_run=True)
    assert dry.outcome is None and dry.plan.changed_stages == ("notify",)
    before = len(log_of(topics, run_id))
    real = upgrade_run(topics, both, run_id, "2", by="ops", reason="notify text")
    assert real.plan == dry.plan  # the dry run printed exactly what happened
    assert real.outcome is not None and real.outcome.result == "completed", real.outcome
    # crashed before its stage was verified: the stages before it are kept
    kept = {"pick": (), "pay": ("pick",), "notify": ("pick", "pay")}[crash_stage]
    assert real.plan.kept_stages == kept
    assert real.executed_stages == real.plan.rerun_stages == tuple(
        s for s in ("pick", "pay", "notify") if s not in kept)
    history = log_of(topics, run_id)
    upgraded = [le.event for le in history[before:] if le.event.type is EventType.RUN_UPGRADED]
    assert len(upgraded) == 1 and upgraded[0].attributes["operator"] == "ops"
    assert (upgraded[0].attributes["from"], upgraded[0].attributes["to"]) == ("1", "2")
    with Resumer(topics, both) as r:
        state = r.load(run_id)[0]
    assert state.status is RunStatus.COMPLETED
    assert state.workflow is not None and state.workflow.version == "2"
    stats = world.stats()
    assert (stats["charges"], stats["assets"], stats["publishes"]) == (1, 1, 1), stats
    with sqlite3.connect(tmp_path / "world" / "platform.db") as db:
        (body,) = db.execute("SELECT body FROM articles").fetchone()
    # notify ran on version 2 unless version 1 had already sent its email (then it is reused)
    assert ("thank you" in body) == (crash_stage != "notify"), body


def test_an_upgrade_is_refused_for_a_version_the_app_does_not_register(
        topics: Settings, world: DemoWorld) -> None:
    from runlog.processors.demo.run import wait_lease_gone

    v1 = orders_app(world.client, crash=_crash_at("pick"))
    run_id = _start_crashed(topics, v1, "u-refused")
    wait_lease_gone(topics, run_id, 10)
    n = len(log_of(topics, run_id))
    with pytest.raises(OperatorRefused, match="not '3'"):
        upgrade_run(topics, orders_app(world.client, versions=("1", "2")), run_id, "3", by="ops", reason="x")
    assert len(log_of(topics, run_id)) == n


def _diverging(fixed: bool) -> App:
    from runlog.producers import DictInputSource, tool

    @tool("lookup")
    def lookup(call: Any, q: str) -> dict[str, Any]:
        return {"answer": q}

    wf = Workflow("coin", "1")

    @wf.stage("first", rules=[rule("ok", lambda o: bool(o["a"]))])
    def first(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"a": ctx.call(lookup, q="first")["answer"]}

    if fixed:
        @wf.stage("second", rules=[rule("ok", lambda o: bool(o["b"]))])
        def second_fixed(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
            return {"b": ctx.call(lookup, q=f"second {ctx.random():.6f}")["answer"]}
    else:
        @wf.stage("second", rules=[rule("ok", lambda o: bool(o["b"]))])
        def second(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
            roll = random.random()
            out = ctx.call(lookup, q=f"second {roll:.6f}")
            if ctx.params.get("crash"):
                raise Abandon("crash")
            return {"b": out["answer"]}
    return App.of([wf], [lookup], DictInputSource({}))


def test_a_diverged_run_continues_on_the_fixed_definition_of_its_version(topics: Settings) -> None:
    from runlog.processors.demo.run import wait_lease_gone

    broken = _diverging(fixed=False)
    runner = Runner.from_settings(topics, source=broken.source)
    try:
        h = runner.start_run(broken.registry.get("coin"), {"crash": True})
        assert h.session is not None
        with contextlib.suppress(Abandon):
            runner.execute(h.session, release=False)
    finally:
        runner.close()
    run_id = h.run_id
    wait_lease_gone(topics, run_id, 10)
    with Resumer(topics, broken) as r:
        blocked = r.resume(run_id)
        assert blocked.result == "blocked"  # random.random() again: the call diverged
    # the block names commands that continue it: retry (the same version, fixed) or upgrade
    assert f"runlog retry {run_id} --app" in blocked.detail
    assert f"runlog upgrade {run_id} --to" in blocked.detail
    fixed = _diverging(fixed=True)
    res = upgrade_run(topics, fixed, run_id, "1", by="ops", reason="use ctx.random")
    assert res.plan.changed_stages == ("second",) and res.plan.kept_stages == ("first",)
    assert res.outcome is not None and res.outcome.result == "completed", res.outcome
    assert res.executed_stages == ("second",)


def test_a_dry_run_refuses_a_run_a_live_writer_holds_as_the_upgrade_does(topics: Settings) -> None:
    from runlog.processors.demo.run import wait_lease_gone

    s = topics.with_(lease_ttl_ms=4000)
    broken, app = _diverging(fixed=False), _diverging(fixed=True)
    runner = Runner.from_settings(s, source=broken.source)
    try:
        h = runner.start_run(broken.registry.get("coin"), {"crash": True})
        assert h.session is not None
        with contextlib.suppress(Abandon):
            runner.execute(h.session, release=False)
    finally:
        runner.close()  # its lease stays until its ttl runs out: a writer that may still be alive
    for dry_run in (True, False):
        with pytest.raises(OperatorRefused, match="held by a live writer"):
            upgrade_run(s, app, h.run_id, "1", by="ops", reason="r", dry_run=dry_run)
    wait_lease_gone(s, h.run_id, 30)
    planned = upgrade_run(s, app, h.run_id, "1", by="ops", reason="r", dry_run=True)
    assert planned.outcome is None and planned.plan.run_id == h.run_id
