"""Nothing runs twice at the edges the demo does not walk, on a second workflow (``_orders``).

Real broker, Redis and demo-world services; workers are separate processes SIGKILLed at
named crash points. Counts come from the services' own storage.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

from runlog.processors.audit import AuditOptions, audit
from runlog.processors.branch import branch_run
from runlog.processors.demo.run import wait_lease_gone
from runlog.processors.resume import Resumer
from runlog.producers.calls._ledger import RedisEffectLedger
from runlog.producers.run._runs import run_id_for_key
from runlog.projections.log_reader import LogReader
from runlog.schemas import Codec, EventType, ResumeRequest, RunEvent, Settings, Topics
from tests.integration.resume._orders import PRICING, orders_app, spawn
from tests.integration.resume._workers import finish
from tests.integration.resume.conftest import DemoWorld, accepted, log_of

pytestmark = pytest.mark.integration


def _crash(settings: Settings, world: DemoWorld, tmp: Path, point: str, *, key: str | None = None,
           mode: str = "fixed", order: str = "o-1") -> str:
    rc, out = finish(spawn(settings, world.url, key=key, order=order, mode=mode, crash_at=point),
                      tmp / f"crash-{uuid.uuid4().hex[:6]}.log")
    assert rc == -9, f"worker for {point} exited {rc}, not killed:\n{out}"
    run_id = next((ln.split("=", 1)[1] for ln in out.splitlines() if ln.startswith("run_id=")), None)
    run_id = run_id or (run_id_for_key(key) if key else None)
    assert run_id is not None, out
    wait_lease_gone(settings, run_id, settings.lease_ttl_ms / 1000 * 4)
    return run_id


def _records(settings: Settings, topic: str) -> list[tuple[bytes, bytes]]:
    with LogReader(settings, topic, name="t-read") as r:
        return [(m.key(), m.value()) for m in r.records(r.topic_ranges())]


# -- 2. the determinism guard -------------------------------------------------------------------


def test_a_tool_argument_from_random_diverges_and_blocks_ctx_random_completes_once(
        topics: Settings, world: DemoWorld, tmp_path: Path) -> None:
    app = orders_app(world.client)
    raw = _crash(topics, world, tmp_path, "before:VERIFIED:pick", mode="raw", order="o-raw")
    assert world.stats()["research_calls"] == 1 and world.stats()["assets"] == 1
    with Resumer(topics, app) as r:
        out = r.resume(raw)
    assert out.result == "blocked", out
    assert "diverged" in out.detail
    new = [le.event for le in accepted(log_of(topics, raw)) if le.event.epoch == out.epoch]
    assert [e.type for e in new][-2:] == [EventType.CALL_DIVERGED, EventType.RUN_BLOCKED]
    div = new[-2]
    assert div.call_id == "pick/quote/0" and div.attributes["recorded_call_id"] == "pick/quote/0"
    assert div.request_hash != div.attributes["recorded_request_hash"]
    assert "diverged" in (new[-1].error.message if new[-1].error else "")
    # the recorded result of the old arguments was not handed back, and nothing ran again
    assert world.stats()["research_calls"] == 1 and world.stats()["uploads"] == 1
    report = audit(topics, AuditOptions(run_id=raw, check_artifacts=False), progress=None)
    kinds = [f.kind for f in report.findings if f.run_id == raw]
    assert "diverged" in kinds, kinds

    ok = _crash(topics, world, tmp_path, "before:VERIFIED:pick", mode="ctx", order="o-ctx")
    before = world.stats()
    with Resumer(topics, app) as r:
        done = r.resume(ok)
    assert done.result == "completed", done
    after = world.stats()
    assert after["research_calls"] == before["research_calls"]  # quote reused, not asked again
    assert after["uploads"] == before["uploads"]  # the reservation reused
    assert after["charges"] == before["charges"] + 1
    new = [le.event for le in accepted(log_of(topics, ok)) if le.event.epoch == done.epoch]
    assert EventType.CALL_DIVERGED not in [e.type for e in new]


def test_an_effect_with_an_open_intent_and_new_arguments_is_not_executed_again(
        topics: Settings, world: DemoWorld, tmp_path: Path) -> None:
    """The issue's worst case: dry-run said ``rerun_same_key`` and the real resume executed the
    effect again with new arguments and a new key. Now the guard blocks it."""
    app = orders_app(world.client)
    run_id = _crash(topics, world, tmp_path, "before:EFFECT_RESULT:pick/reserve/1", mode="raw")
    assert world.stats()["assets"] == 1
    # the worker died after the call returned and before even the ledger heard of its result
    intent = next(le.event for le in accepted(log_of(topics, run_id))
                  if le.event.type is EventType.EFFECT_INTENT)
    assert intent.delivery_key is not None
    r = redis.Redis.from_url(topics.redis_url)
    try:
        assert r.delete(RedisEffectLedger(r, topics.redis_prefix).claim_key(intent.delivery_key)) == 1
    finally:
        r.close()
    with Resumer(topics, app) as r:
        planned = r.resume(run_id, dry_run=True)
        assert [e.action for e in planned.plan.effects] == ["rerun_same_key"]
        out = r.resume(run_id)
    assert out.result == "blocked" and "diverged" in out.detail
    assert world.stats()["assets"] == 1 and world.stats()["uploads"] == 1


# -- 1. a run start that cannot strand ---------------------------------------------------------


@pytest.mark.parametrize("point", ["before:CLAIM:run", "after:CLAIM:run", "before:RUN_STARTED:run",
                                   "after:RUN_STARTED:run"])
def test_a_run_start_crashed_anywhere_then_retried_gives_one_completed_run(
        topics: Settings, world: DemoWorld, tmp_path: Path, point: str) -> None:
    key = f"order-{uuid.uuid4().hex[:8]}"
    run_id = _crash(topics, world, tmp_path, point, key=key)
    assert run_id == run_id_for_key(key)
    rc, out = finish(spawn(topics, world.url, key=key, mode="fixed"), tmp_path / "retry.log")
    assert rc == 0, out
    assert f"run_id={run_id}" in out
    if "completed=True" not in out:  # the run existed: the retry asked the resumer to continue it
        assert point == "after:RUN_STARTED:run", out
        codec = Codec()
        reqs = [codec.decode(v, ResumeRequest) for _, v in _records(topics, Topics.of(topics).resume)]
        assert run_id in [q.run_id for q in reqs]
        with Resumer(topics, orders_app(world.client)) as r:
            assert r.resume(run_id).result == "completed"
    # one run for the key, started once, completed; every effect once
    codec = Codec()
    events = [codec.decode(v, RunEvent) for _, v in _records(topics, Topics.of(topics).events)]
    assert {e.run_id for e in events} == {run_id}
    history = accepted(log_of(topics, run_id))
    assert [le.event.type for le in history].count(EventType.RUN_STARTED) == 1
    assert history[-1].event.type is EventType.RUN_COMPLETED
    s = world.stats()
    assert (s["charges"], s["assets"], s["publishes"]) == (1, 1, 1), s
    # and the key keeps naming that run
    rc, out = finish(spawn(topics, world.url, key=key, mode="fixed"), tmp_path / "again.log")
    assert rc == 0 and f"run_id={run_id}" in out and "created=false" in out, out


# -- 3. one ledger for all runs ------------------------------------------------------------------


def test_a_branch_of_a_run_blocked_on_an_in_doubt_charge_does_not_charge_again(
        topics: Settings, world: DemoWorld, tmp_path: Path) -> None:
    app = orders_app(world.client)
    run_id = _crash(topics, world, tmp_path, "inside:TOOL:pay/charge/0")
    assert world.stats()["charges"] == 0  # the intent is on the log; whether it happened is unknown
    with Resumer(topics, app) as r:
        out = r.resume(run_id)
    assert out.result == "blocked" and "a person must check" in out.detail

    res = branch_run(topics, app, run_id, {"pricing": "v2"})

    assert not res.completed
    assert res.blocked_reason is not None and "in doubt in run " + run_id in res.blocked_reason
    assert world.stats()["charges"] == 0
    child = accepted(log_of(topics, res.run_id))
    assert child[-1].event.type is EventType.RUN_BLOCKED
    assert not [le for le in child if le.event.type is EventType.EFFECT_INTENT]


def test_a_charge_made_before_the_writer_died_is_taken_from_the_ledger_not_made_again(
        topics: Settings, world: DemoWorld, tmp_path: Path) -> None:
    app = orders_app(world.client)
    run_id = _crash(topics, world, tmp_path, "before:EFFECT_RESULT:pay/charge/0")
    assert world.stats()["charges"] == 1  # it happened; the log does not know, the ledger does

    branched = branch_run(topics, app, run_id, {"pricing": "v2"})  # the parent is still RUNNING
    assert branched.completed
    assert world.stats()["charges"] == 1
    with Resumer(topics, app) as r:
        out = r.resume(run_id)
    assert out.result == "completed", out
    assert [(e.call_id, e.action) for e in out.plan.effects] == [("pay/charge/0", "reuse_ledger")]
    assert world.stats()["charges"] == 1
    new = [le.event for le in accepted(log_of(topics, run_id)) if le.event.epoch == out.epoch]
    rec = next(e for e in new if e.type is EventType.EFFECT_RECONCILED)
    assert (rec.call_id, rec.external_id, rec.attributes["source"]) == ("pay/charge/0", "ch-1", "ledger")


def test_a_branch_reuses_effects_done_in_the_parent(
        topics: Settings, world: DemoWorld, tmp_path: Path) -> None:
    app = orders_app(world.client)
    rc, out = finish(spawn(topics, world.url, key=None), tmp_path / "parent.log")
    assert rc == 0 and "completed=True" in out, out
    parent = next(ln.split("=", 1)[1] for ln in out.splitlines() if ln.startswith("run_id="))
    parent_log = accepted(log_of(topics, parent))
    charge_id = next(le.event.external_id for le in parent_log if le.event.type is EventType.EFFECT_RESULT
                     and le.event.tool == "charge")

    res = branch_run(topics, app, parent, {"pricing": "v2"})

    assert res.completed and res.rerun_stages == ("pay", "notify")
    s = world.stats()
    assert (s["charges"], s["publishes"]) == (1, 1), s
    child = accepted(log_of(topics, res.run_id))
    rec = [le.event for le in child if le.event.type is EventType.EFFECT_RECONCILED]
    assert {e.tool for e in rec} == {"charge", "email"}
    charge = next(e for e in rec if e.tool == "charge")
    assert charge.external_id == charge_id
    assert charge.attributes["source"] == "ledger" and charge.attributes["from_run"] == parent
    assert not [le for le in child if le.event.type in (EventType.EFFECT_INTENT, EventType.EFFECT_RESULT)]


# -- recorded results that cannot be trusted ------------------------------------------------------


def _damage(ref: Any, how: str) -> None:
    path = Path(urlsplit(ref.uri).path)
    if how == "delete":
        path.unlink()
    else:
        path.write_bytes(b'{"tampered": true}')


def test_a_missing_or_corrupt_recorded_result_is_not_reused(
        topics: Settings, world: DemoWorld, tmp_path: Path) -> None:
    topics = topics.with_(artifact_inline_bytes=0)  # results in files, which this test damages
    app = orders_app(world.client)
    run_id = _crash(topics, world, tmp_path, "before:VERIFIED:pick")
    results = {le.event.call_id: le.event.payload_ref for le in accepted(log_of(topics, run_id))
               if le.event.type is EventType.TOOL_RESULT}
    _damage(results["pick/quote/0"], "corrupt")
    _damage(results["pick/reserve/1"], "delete")
    before = world.stats()
    with Resumer(topics, app) as r:
        out = r.resume(run_id)
    assert out.result == "completed", out
    assert sorted(c for c, _ in out.plan.unusable_results) == ["pick/quote/0", "pick/reserve/1"]
    after = world.stats()
    assert after["research_calls"] == before["research_calls"] + 1  # SAFE: asked again
    assert after["uploads"] == before["uploads"]  # the effect is recorded done: its external id reused
    new = [le.event for le in accepted(log_of(topics, run_id)) if le.event.epoch == out.epoch]
    called = [e.call_id for e in new if e.type is EventType.TOOL_CALLED]
    assert "pick/quote/0" in called and "pick/reserve/1" not in called


# -- the dry run says what the real resume does -------------------------------------------------


POINTS = {
    "before:VERIFIED:pick": {"reuse"},
    "inside:TOOL:pick/reserve/1": {"rerun_same_key"},
    "before:TOOL_RESULT:pay/charge/0": {"reuse_external"},
    "before:EFFECT_RESULT:notify/email/0": {"reconcile"},
    "before:EFFECT_RESULT:pay/charge/0": {"reuse_ledger"},
    "inside:TOOL:notify/email/0": {"reconcile"},
    "inside:TOOL:pay/charge/0": {"block"},
}


@pytest.mark.parametrize("point", sorted(POINTS))
def test_every_planned_action_matches_the_events_the_real_resume_appends(
        topics: Settings, world: DemoWorld, tmp_path: Path, point: str) -> None:
    app = orders_app(world.client)
    run_id = _crash(topics, world, tmp_path, point)
    before = accepted(log_of(topics, run_id))
    recorded_keys = {le.event.call_id: le.event.idempotency_key for le in before
                     if le.event.type is EventType.TOOL_CALLED}
    with Resumer(topics, app) as r:
        plan = r.resume(run_id, dry_run=True).plan
        out = r.resume(run_id)
    actions = {e.action for e in plan.effects} | ({"reuse"} if plan.reused_calls else set())
    assert POINTS[point] <= actions, (point, plan.to_dict())
    new = [le.event for le in accepted(log_of(topics, run_id)) if le.event.epoch == out.epoch]
    called = {e.call_id: e for e in new if e.type is EventType.TOOL_CALLED}
    for call_id in plan.reused_calls:
        assert call_id not in called, f"{call_id} was planned as reused but called again"
    for eff in plan.effects:
        cid = eff.call_id or ""
        if eff.action == "block":
            assert out.result == "blocked" and new[-1].type is EventType.RUN_BLOCKED
            assert EventType.STAGE_STARTED not in [e.type for e in new]
        elif eff.action == "rerun_same_key":
            assert cid in called and called[cid].idempotency_key == recorded_keys[cid]
        elif eff.action == "reuse_external":
            assert cid not in called
            assert [e for e in new if e.type is EventType.TOOL_RESULT and e.call_id == cid
                    and e.attributes.get("source") == "reconciled"]
        elif eff.action == "reuse_ledger":
            assert cid not in called
            assert [e for e in new if e.type is EventType.EFFECT_RECONCILED and e.call_id == cid
                    and e.external_id == eff.external_id and e.attributes.get("source") == "ledger"]
        elif eff.action == "reconcile":
            reconciled = [e for e in new if e.type is EventType.EFFECT_RECONCILED
                          and e.delivery_key == eff.delivery_key]
            assert reconciled or cid in called  # found in the external system, or executed once
    if "block" not in actions:
        assert out.result == "completed", out
    s = world.stats()
    assert s["charges"] <= 1 and s["assets"] <= 1 and s["publishes"] <= 1, s


def test_a_branch_blocked_by_its_parents_in_doubt_charge_says_what_ran_and_where_to_resolve(
        topics: Settings, world: DemoWorld, tmp_path: Path) -> None:
    """Issue 25, item 4: the branch reports the stages it ran (not its plan) and where it blocked;
    `runlog resolve` on the branch names the parent run holding the effect; once the parent's effect is
    decided, `runlog retry` continues the branch, which charges exactly once."""
    from runlog.processors.operate import OperatorRefused, resolve_effect, retry_run

    app = orders_app(world.client)
    run_id = _crash(topics, world, tmp_path, "inside:TOOL:pay/charge/0")
    with Resumer(topics, app) as r:
        assert r.resume(run_id).result == "blocked"
    res = branch_run(topics, app, run_id, {"pricing": "v2"})
    assert not res.completed and res.blocked_stage == "pay"
    assert "pay" in res.rerun_stages and "notify" in res.rerun_stages  # the plan
    assert "pay" not in res.ran_stages and "notify" not in res.ran_stages  # what happened
    parent_dk = next(iter(accepted(log_of(topics, run_id))[-1].state.open_effects))
    with pytest.raises(OperatorRefused) as refused:
        resolve_effect(topics, res.run_id, parent_dk[:16], done=False, external_id=None, by="bob",
                       reason="checked")
    said = str(refused.value)
    assert f"run {res.run_id} has no open effect of its own" in said and "its open effects: none" not in said
    assert f"charge (call pay/charge/0) of run {run_id}, delivery key {parent_dk}, in doubt there" in said
    assert f"Resolve it in run {run_id}: `runlog resolve {run_id} --effect {parent_dk[:16]}" in said
    assert f"`runlog retry {res.run_id}` continues this run" in said
    # a retry of the branch would only block again: refused, nothing appended
    before = len(log_of(topics, res.run_id))
    with pytest.raises(OperatorRefused, match=f"would block again: it is blocked by charge .* run {run_id}"):
        retry_run(topics, app, res.run_id, by="bob", reason="too early")
    assert len(log_of(topics, res.run_id)) == before
    resolve_effect(topics, run_id, parent_dk, done=False, external_id=None, by="bob",
                   reason="the provider has no such charge")
    with pytest.raises(OperatorRefused, match=f"decided now \\(not done\\): `runlog retry {res.run_id}`"):
        resolve_effect(topics, res.run_id, parent_dk[:16], done=False, external_id=None, by="bob",
                       reason="checked")
    out = retry_run(topics, app, res.run_id, by="bob", reason="the parent's charge was decided")
    assert out.result == "completed", out
    assert world.stats()["charges"] == 1


def test_runlog_branch_prints_what_the_branch_did_not_its_plan(
        topics: Settings, world: DemoWorld, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 25, item 5: `runlog branch` of a run blocked on an in-doubt charge printed "re-ran pay,
    notify" (the plan) although the branch blocked in pay and notify never ran."""
    import runlog.processors.resume
    from runlog.processors.cli import main

    app = orders_app(world.client)
    run_id = _crash(topics, world, tmp_path, "inside:TOOL:pay/charge/0")
    with Resumer(topics, app) as r:
        assert r.resume(run_id).result == "blocked"
    monkeypatch.setattr(Settings, "from_env", classmethod(lambda cls, env=None: topics))
    monkeypatch.setattr(runlog.processors.resume, "load_app", lambda spec: app)
    capsys.readouterr()

    rc = main(["branch", run_id, "--input", "pricing=v2", "--app", "orders:app"])
    line = capsys.readouterr().out.strip()
    assert rc == 1, line
    assert "inherited pick; ran and verified no stage; BLOCKED in pay: " in line, line
    assert f"in doubt in run {run_id}" in line and line.endswith("; never ran notify; NOT completed"), line
    assert "re-ran" not in line

    rc = main(["branch", run_id, "--input", "pricing=v2", "--app", "orders:app", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert (doc["rerun_stages"], doc["ran_stages"], doc["blocked_stage"], doc["not_run_stages"]) == (
        ["pay", "notify"], [], "pay", ["notify"]), doc
    assert doc["completed"] is False and f"in doubt in run {run_id}" in doc["blocked_reason"]

    # `runlog resolve` on the branch names the run holding the in-doubt effect (issue 25, item 5)
    parent_dk = next(iter(accepted(log_of(topics, run_id))[-1].state.open_effects))
    rc = main(["resolve", doc["run_id"], "--effect", parent_dk[:16], "--not-done", "--by", "bob",
               "--reason", "checked"])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert f"runlog resolve: refused: run {doc['run_id']} has no open effect of its own" in err, err
    assert f"charge (call pay/charge/0) of run {run_id}, delivery key {parent_dk}" in err, err
    assert f"Resolve it in run {run_id}: `runlog resolve {run_id} --effect {parent_dk[:16]}" in err, err

    # a stage that fails (a pricing version without a price): its FAILED, not a traceback
    monkeypatch.setitem(PRICING, "v3", {})
    priceless = orders_app(world.client)  # its input source copies PRICING
    monkeypatch.setattr(runlog.processors.resume, "load_app", lambda spec: priceless)
    rc = main(["branch", run_id, "--input", "pricing=v3", "--app", "orders:app"])
    out = capsys.readouterr()
    line = out.out.strip()
    assert rc == 1, (line, out.err)
    assert "; ran and verified no stage; FAILED in pay: KeyError: " in line, (line, out.err)
    assert line.endswith("; never ran notify; NOT completed"), line
    assert world.stats()["charges"] == 0
