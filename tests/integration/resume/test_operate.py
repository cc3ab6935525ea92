"""People in the loop (``runlog.processors.operate``): resolve an in-doubt effect, cancel, retry.

Real broker, Redis and demo-world services. Workers are separate processes (SIGKILLed at
crash points, or alive and slow for the cancel tests); counts come from the services' own
storage or from files the tools write as they start.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from runlog.processors.audit import AuditOptions, audit
from runlog.processors.demo.run import wait_lease_gone, worker_env
from runlog.processors.operate import OperatorRefused, cancel_run, load_run, resolve_effect, retry_run
from runlog.processors.resume import App, Resumer, ResumerService
from runlog.producers import (
    CallInfo,
    DictInputSource,
    LocalArtifactStore,
    RetryPolicy,
    Runner,
    StageContext,
    Workflow,
    tool,
)
from runlog.producers.calls._keys import delivery_key
from runlog.producers.calls._ledger import RedisEffectLedger
from runlog.producers.run._active import ActiveRuns
from runlog.projections import RunStatus
from runlog.schemas import (
    EffectStatus,
    EventType,
    ReplayPolicy,
    RetryableToolError,
    Settings,
    TerminalToolError,
)
from tests.integration.resume._orders import orders_app, spawn
from tests.integration.resume._slow import slow_app, started
from tests.integration.resume._slow import spawn as spawn_slow
from tests.integration.resume.conftest import DemoWorld, accepted, log_of, project

pytestmark = pytest.mark.integration

WHY = "checked the provider"


def _finish(proc: subprocess.Popen[str], log: Path) -> tuple[int, str]:
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    log.write_text(out + err)
    return proc.returncode, out


def _crash(settings: Settings, world: DemoWorld, tmp: Path, point: str) -> str:
    """An orders run (mode ``fixed``) whose worker SIGKILLed itself at ``point``; its lease is gone."""
    rc, out = _finish(spawn(settings, world.url, key=None, mode="fixed", crash_at=point),
                      tmp / f"crash-{uuid.uuid4().hex[:6]}.log")
    assert rc == -9, f"worker for {point} exited {rc}, not killed:\n{out}"
    run_id = next(ln.split("=", 1)[1] for ln in out.splitlines() if ln.startswith("run_id="))
    wait_lease_gone(settings, run_id, settings.lease_ttl_ms / 1000 * 4)
    return run_id


def _runlog(settings: Settings, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runlog", *args], env=worker_env(settings, ""),
                          cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def _blocked_on_charge(topics: Settings, world: DemoWorld, tmp: Path, point: str) -> tuple[str, str]:
    """An orders run crashed at ``point`` and resumed into BLOCKED on its charge; (run id, delivery key)."""
    run_id = _crash(topics, world, tmp, point)
    with Resumer(topics, orders_app(world.client)) as r:
        out = r.resume(run_id)
    assert out.result == "blocked" and "a person must check" in out.detail, out
    state = load_run(topics, run_id)
    assert state is not None and state.status is RunStatus.BLOCKED
    [eff] = state.open_intents
    assert eff.call_id == "pay/charge/0"
    return run_id, eff.delivery_key


def _epoch(topics: Settings, run_id: str) -> bytes | None:
    r = redis.Redis.from_url(topics.redis_url)
    try:
        value: bytes | None = r.get(f"{topics.redis_prefix}:{{{run_id}}}:epoch")
        return value
    finally:
        r.close()


def _ledger(topics: Settings, dk: str) -> Any:
    r = redis.Redis.from_url(topics.redis_url)
    try:
        return RedisEffectLedger(r, topics.redis_prefix).lookup(dk)
    finally:
        r.close()


def _audit_entries(topics: Settings, run_id: str, type_: EventType) -> tuple[list[dict[str, Any]], list[str]]:
    report = audit(topics, AuditOptions(run_id=run_id, check_artifacts=False), progress=None)
    run = report.runs[run_id].to_dict()
    entries = [e for e in run["events"] if e["type"] == type_.value and e["outcome"] == "accepted"]
    return entries, [f.kind for f in report.findings if f.run_id == run_id]


def _stage_output(topics: Settings, run_id: str, stage: str) -> dict[str, Any]:
    ev = next(le.event for le in accepted(log_of(topics, run_id))
              if le.event.type is EventType.VERIFIED and le.event.stage == stage)
    assert ev.payload_ref is not None
    doc: dict[str, Any] = json.loads(LocalArtifactStore(topics.artifact_root).get(ev.payload_ref))
    return doc


# -- 1. resolve ---------------------------------------------------------------------------------


def test_a_charge_resolved_done_is_not_made_again_and_the_run_completes_with_its_id(
        topics: Settings, world: DemoWorld, tmp_path: Path) -> None:
    run_id, dk = _blocked_on_charge(topics, world, tmp_path, "inside:TOOL:pay/charge/0")
    assert world.stats()["charges"] == 0

    res = resolve_effect(topics, run_id, dk[:12], done=True, external_id="ch-7", by="alice", reason=WHY)

    assert (res.action, res.status) == ("resolve", "RUNNING")
    ev = next(le for le in log_of(topics, run_id) if le.event.seq == res.seq)
    assert ev.outcome.accepted and ev.event.type is EventType.EFFECT_RESOLVED and ev.event.epoch == res.epoch
    assert (ev.event.delivery_key, ev.event.call_id, ev.event.external_id) == (dk, "pay/charge/0", "ch-7")
    assert {k: ev.event.attributes[k] for k in ("by", "reason", "decision")} == \
        {"by": "alice", "reason": WHY, "decision": "done"}
    lease = next(le.event for le in log_of(topics, run_id) if le.event.seq == res.seq - 1)
    assert lease.type is EventType.LEASE_ACQUIRED
    assert (lease.attributes["operator"], lease.attributes["action"]) == ("alice", "resolve")
    known = _ledger(topics, dk)
    assert (known.status, known.external_id) == (EffectStatus.DONE, "ch-7")

    with Resumer(topics, orders_app(world.client)) as r:
        out = r.resume(run_id)

    assert out.result == "completed", out
    assert world.stats()["charges"] == 0  # the external id was reused: nothing charged
    assert _stage_output(topics, run_id, "pay") == {"charge_id": "ch-7"}
    new = [le.event for le in accepted(log_of(topics, run_id)) if le.event.epoch == out.epoch]
    assert not [e for e in new if e.tool == "charge" and e.type in (EventType.TOOL_CALLED,
                                                                      EventType.EFFECT_INTENT)]
    entries, findings = _audit_entries(topics, run_id, EventType.EFFECT_RESOLVED)
    assert [(e["by"], e["reason"], e["decision"]) for e in entries] == [("alice", WHY, "done")]
    assert findings == []


def test_a_charge_made_before_the_crash_with_its_ledger_claim_lost_is_resolved_done_once(
        topics: Settings, world: DemoWorld, tmp_path: Path) -> None:
    run_id = _crash(topics, world, tmp_path, "before:EFFECT_RESULT:pay/charge/0")
    assert world.stats()["charges"] == 1
    intent = next(le.event for le in accepted(log_of(topics, run_id))
                  if le.event.type is EventType.EFFECT_INTENT and le.event.tool == "charge")
    assert intent.delivery_key is not None
    r = redis.Redis.from_url(topics.redis_url)
    try:  # the ledger lost its claim: nothing but a person knows the charge happened
        assert r.delete(RedisEffectLedger(r, topics.redis_prefix).claim_key(intent.delivery_key)) == 1
    finally:
        r.close()
    with Resumer(topics, orders_app(world.client)) as rs:
        assert rs.resume(run_id).result == "blocked"
    assert world.stats()["charges"] == 1

    resolve_effect(topics, run_id, intent.delivery_key, done=True, external_id="ch-1", by="alice", reason=WHY)
    with Resumer(topics, orders_app(world.client)) as rs:
        out = rs.resume(run_id)

    assert out.result == "completed", out
    assert world.stats()["charges"] == 1
    assert _stage_output(topics, run_id, "pay") == {"charge_id": "ch-1"}


def test_a_charge_resolved_not_done_is_made_exactly_once_by_the_next_resume(
        topics: Settings, world: DemoWorld, tmp_path: Path) -> None:
    run_id, dk = _blocked_on_charge(topics, world, tmp_path, "inside:TOOL:pay/charge/0")
    assert world.stats()["charges"] == 0

    cli = _runlog(topics, "resolve", run_id, "--effect", dk, "--not-done", "--by", "bob", "--reason",
                  "the provider has no such charge", "--no-resume", "--json", cwd=tmp_path)

    assert cli.returncode == 0, cli.stderr
    doc = json.loads(cli.stdout)
    assert (doc["run_id"], doc["action"], doc["status"], doc["resume_requested"]) == \
        (run_id, "resolve", "RUNNING", False)
    assert _ledger(topics, dk).status is EffectStatus.FAILED  # the next attempt may claim the key
    with Resumer(topics, orders_app(world.client)) as r:
        planned = r.resume(run_id, dry_run=True)
        assert [e.action for e in planned.plan.effects] == []  # neither blocked nor "reused"
        assert "pay/charge/0" not in planned.plan.reused_calls
        out = r.resume(run_id)

    assert out.result == "completed", out
    assert world.stats()["charges"] == 1
    new = [le.event for le in accepted(log_of(topics, run_id)) if le.event.epoch == out.epoch]
    kinds = (EventType.EFFECT_INTENT, EventType.EFFECT_RESULT)
    effects = [(e.type, e.call_id) for e in new if e.type in kinds and e.tool == "charge"]
    assert effects == [(EventType.EFFECT_INTENT, "pay/charge/0"), (EventType.EFFECT_RESULT, "pay/charge/0")]
    assert _stage_output(topics, run_id, "pay") == {"charge_id": "ch-1"}
    entries, findings = _audit_entries(topics, run_id, EventType.EFFECT_RESOLVED)
    assert [(e["by"], e["reason"], e["decision"]) for e in entries] == \
        [("bob", "the provider has no such charge", "not_done")]
    assert findings == []


def test_refused_resolutions_append_nothing_and_take_no_lease(
        topics: Settings, world: DemoWorld, tmp_path: Path) -> None:
    run_id, dk = _blocked_on_charge(topics, world, tmp_path, "inside:TOOL:pay/charge/0")
    n, epoch = len(log_of(topics, run_id)), _epoch(topics, run_id)

    def refused(match: str, **kw: Any) -> None:
        args: dict[str, Any] = {"key": dk, "done": True, "external_id": "ch-7", "by": "alice", "reason": WHY,
                                **kw}
        key = args.pop("key")
        with pytest.raises(OperatorRefused, match=match):
            resolve_effect(topics, args.pop("run_id", run_id), key, **args)
        assert len(log_of(topics, run_id)) == n and _epoch(topics, run_id) == epoch

    refused("no open effect", key="0" * 64 if not dk.startswith("0") else "f" * 64)
    refused("--by", by="")
    refused("--by", by="   ")
    refused("--reason", reason="")
    refused("--external-id", external_id=None)
    refused("goes with --done", done=False)
    refused("no run", run_id="run-" + "0" * 32)
    cli = _runlog(topics, "resolve", run_id, "--effect", dk, "--done", "--external-id", "ch-7",
                  "--reason", WHY, cwd=tmp_path)
    # argparse: the required option is missing (usage, exit 2), the command never ran
    assert cli.returncode == 2 and "--by" in cli.stderr and "Traceback" not in cli.stderr, cli
    assert len(log_of(topics, run_id)) == n and _epoch(topics, run_id) == epoch

    # a run that is not blocked
    rc, out = _finish(spawn(topics, world.url, key=None, order="o-2"), tmp_path / "done.log")
    assert rc == 0 and "completed=True" in out, out
    done = next(ln.split("=", 1)[1] for ln in out.splitlines() if ln.startswith("run_id="))
    m = len(log_of(topics, done))
    with pytest.raises(OperatorRefused, match="not BLOCKED"):
        resolve_effect(topics, done, dk, done=True, external_id="ch-1", by="alice", reason=WHY)
    with pytest.raises(OperatorRefused, match="COMPLETED"):
        cancel_run(topics, done, by="alice", reason="too late")
    with pytest.raises(OperatorRefused, match="not FAILED"):
        retry_run(topics, orders_app(world.client), done, by="alice")
    assert len(log_of(topics, done)) == m


def test_resolve_refuses_a_running_run_with_an_open_effect_and_appends_nothing(
        topics: Settings, world: DemoWorld, tmp_path: Path) -> None:
    """A worker killed inside its charge leaves the run ``RUNNING`` with the charge's intent open and no
    lease (no resume has yet found the effect in doubt): resolving that effect is refused because the
    run is not ``BLOCKED``, though the effect exists and its lease is free to take."""
    run_id = _crash(topics, world, tmp_path, "inside:TOOL:pay/charge/0")
    state = load_run(topics, run_id)
    assert state is not None and state.status is RunStatus.RUNNING
    [eff] = state.open_intents
    assert eff.call_id == "pay/charge/0"
    dk = eff.delivery_key
    n, epoch, ledger = len(log_of(topics, run_id)), _epoch(topics, run_id), _ledger(topics, dk)

    for done, ext in ((True, "ch-7"), (False, None)):
        with pytest.raises(OperatorRefused, match=f"run {run_id} is RUNNING, not BLOCKED"):
            resolve_effect(topics, run_id, dk, done=done, external_id=ext, by="alice", reason=WHY)
    cli = _runlog(topics, "resolve", run_id, "--effect", dk[:12], "--done", "--external-id", "ch-7",
                  "--by", "alice", "--reason", WHY, cwd=tmp_path)
    assert cli.returncode == 1 and "RUNNING, not BLOCKED" in cli.stderr, cli

    assert len(log_of(topics, run_id)) == n and _epoch(topics, run_id) == epoch
    assert _ledger(topics, dk) == ledger
    after = load_run(topics, run_id)
    assert after is not None and after.status is RunStatus.RUNNING
    assert [e.delivery_key for e in after.open_intents] == [dk]
    assert world.stats()["charges"] == 0


class Crash(BaseException):
    """The worker dies inside the tool (what a SIGKILL leaves on the log: an intent, no result)."""


def _two_charges_app(calls: list[str], crash: list[bool], runs: set[str]) -> tuple[App, str, str]:
    """A stage charging two orders whose delivery keys share their first hex digit."""
    def key(obj: str) -> str:
        return delivery_key("acct-two", "cards", obj, "1")

    objs = [f"o-{i}" for i in range(17)]
    a = next(x for x in objs if any(key(y)[0] == key(x)[0] for y in objs if y != x))
    b = next(y for y in objs if y != a and key(y)[0] == key(a)[0])

    @tool("card", policy=ReplayPolicy.NEVER, target="cards:test",
          delivery=lambda args, call: ("acct-two", "cards", args["obj"], "1"))
    def card(call: CallInfo, obj: str) -> Any:
        calls.append(obj)
        runs.add(call.run_id)
        if crash[0]:
            raise Crash(obj)
        return {"external_id": f"x-{obj}"}

    wf = Workflow("two", version="1")

    @wf.stage("pay")
    def pay(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        try:
            first = ctx.call(card, obj=a)["external_id"]
        except Crash:
            first = None
        return {"first": first, "second": ctx.call(card, obj=b)["external_id"]}

    return App.of([wf], [card], DictInputSource({})), key(a), key(b)


def test_an_ambiguous_prefix_is_refused_and_each_of_two_open_effects_is_resolved_on_its_own(
        topics: Settings) -> None:
    calls: list[str] = []
    crash = [True]
    runs: set[str] = set()
    app, ka, kb = _two_charges_app(calls, crash, runs)
    with Runner.from_settings(topics, source=app.source) as runner, pytest.raises(Crash):
        runner.run(app.registry.get("two"), {})
    [run_id] = runs
    crash[0] = False
    with Resumer(topics, app) as r:
        assert r.resume(run_id).result == "blocked"
    n = len(log_of(topics, run_id))
    common = next(i for i in range(64) if ka[i] != kb[i])
    with pytest.raises(OperatorRefused, match="ambiguous"):
        resolve_effect(topics, run_id, ka[:common], done=True, external_id="x-a", by="alice", reason=WHY)
    assert len(log_of(topics, run_id)) == n

    first = resolve_effect(topics, run_id, ka[:common + 1], done=True, external_id="x-a", by="alice",
                           reason=WHY)
    assert first.status == "BLOCKED"  # the other charge still keeps it blocked
    second = resolve_effect(topics, run_id, kb, done=False, external_id=None, by="alice", reason=WHY)
    assert second.status == "RUNNING" and second.epoch == first.epoch + 1
    del calls[:]
    with Resumer(topics, app) as r:
        out = r.resume(run_id)
    assert out.result == "completed", out
    assert len(calls) == 1  # only the charge resolved not done, once
    assert _stage_output(topics, run_id, "pay") == {"first": "x-a", "second": f"x-{calls[0]}"}


# -- 2. cancel ----------------------------------------------------------------------------------


def _wait_for(cond: Any, timeout: float, what: str) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_cancel_fences_a_live_worker_which_starts_no_further_tool_call_and_nothing_resumes_it(
        topics: Settings, tmp_path: Path) -> None:
    # a long lease: the worker's heartbeat (every ttl/3) cannot notice the takeover in time, only
    # the round trip before each tool call does
    worker_settings = dataclasses.replace(topics, lease_ttl_ms=60_000)
    ticks = tmp_path / "ticks"
    proc = spawn_slow(worker_settings, ticks, count=5, delay=3.0)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("run_id="), line + (proc.stderr.read() if proc.stderr else "")
        run_id = line.strip().split("=", 1)[1]
        _wait_for(lambda: len(started(ticks)) >= 1, 60, "the first tick")
        project(topics)  # the projection shows the run RUNNING (a sweep candidate)
        _wait_for(lambda: len(started(ticks)) >= 2, 30, "the second tick")

        res = cancel_run(topics, run_id, by="carol", reason="customer withdrew the order")

        begun = started(ticks)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)  # reaps it and closes its pipes
    assert proc.returncode == 3 and "lease_lost=" in out, (proc.returncode, out, err)
    assert begun == [0, 1] and started(ticks) == begun  # no tool call started after the cancel
    history = log_of(topics, run_id)
    mine = next(i for i, le in enumerate(history) if le.event.seq == res.seq and le.outcome.accepted)
    assert history[mine].event.type is EventType.RUN_CANCELLED
    assert history[mine].event.attributes["by"] == "carol"
    late = history[mine + 1:]
    assert late, "the worker appended nothing after the cancel: its in-flight call's result was expected"
    assert all(le.outcome.rejected and le.event.epoch < res.epoch for le in late), late
    assert [le.event.type for le in late] == [EventType.TOOL_RESULT]
    state = history[-1].state
    assert state.status is RunStatus.CANCELLED and state.last_seq == res.seq

    n = len(history)
    app = slow_app()
    with Resumer(topics, app) as r:
        assert r.resume(run_id).result == "cancelled"
    assert len(log_of(topics, run_id)) == n  # no lease taken, nothing appended
    with ResumerService(topics, app) as service:
        assert run_id in service.sweeper.candidates()  # the projection still says RUNNING...
        assert run_id not in service.sweep().requested  # ...and the sweep skips it
    r2 = redis.Redis.from_url(topics.redis_url)
    try:
        assert run_id not in ActiveRuns(r2, topics.redis_prefix)
    finally:
        r2.close()
    entries, _ = _audit_entries(topics, run_id, EventType.RUN_CANCELLED)
    assert [(e["by"], e["reason"]) for e in entries] == [("carol", "customer withdrew the order")]

    with pytest.raises(OperatorRefused, match="CANCELLED"):
        cancel_run(topics, run_id, by="carol", reason="again")
    with pytest.raises(OperatorRefused, match="--by"):
        cancel_run(topics, run_id, by="", reason="again")
    cli = _runlog(topics, "cancel", run_id, "--by", "carol", "--reason", "again", cwd=tmp_path)
    assert cli.returncode == 1 and "CANCELLED" in cli.stderr
    assert len(log_of(topics, run_id)) == n


# -- 3. retry -----------------------------------------------------------------------------------


def _flaky_app(counts: dict[str, int], fail: list[type[Exception] | None], runs: set[str]) -> App:
    @tool("prep", policy=ReplayPolicy.SAFE)
    def prep(call: CallInfo) -> Any:
        runs.add(call.run_id)
        counts["prep"] += 1
        return {"v": 2}

    @tool("flaky", policy=ReplayPolicy.SAFE, retry=RetryPolicy(attempts=1))
    def flaky(call: CallInfo, v: int) -> Any:
        counts["flaky"] += 1
        if fail[0] is not None:
            raise fail[0]("the service said no")
        return {"w": v * 10}

    wf = Workflow("flaky", version="1")

    @wf.stage("work")
    def work(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"w": ctx.call(flaky, v=ctx.call(prep)["v"])["w"]}

    return App.of([wf], [prep, flaky], DictInputSource({}))


@pytest.mark.parametrize("error", [RetryableToolError, TerminalToolError])
def test_a_failed_run_is_retried_from_its_stage_terminal_failures_only_with_force(
        topics: Settings, error: type[Exception]) -> None:
    counts = {"prep": 0, "flaky": 0}
    fail: list[type[Exception] | None] = [error]
    runs: set[str] = set()
    app = _flaky_app(counts, fail, runs)
    with Runner.from_settings(topics, source=app.source) as runner, pytest.raises(error):
        runner.run(app.registry.get("flaky"), {})
    [run_id] = runs
    state = load_run(topics, run_id)
    assert state is not None and state.status is RunStatus.FAILED
    assert state.last_error is not None and state.last_error.retryable is (error is RetryableToolError)
    n = len(log_of(topics, run_id))
    with Resumer(topics, app) as r:  # a plain resume does not retry a failed run
        assert r.resume(run_id).result == "failed"
    with pytest.raises(OperatorRefused, match="--by"):
        retry_run(topics, app, run_id, by="")
    fail[0] = None
    if error is TerminalToolError:
        with pytest.raises(OperatorRefused, match="--force"):
            retry_run(topics, app, run_id, by="dave")
    assert len(log_of(topics, run_id)) == n and counts == {"prep": 1, "flaky": 1}

    out = retry_run(topics, app, run_id, by="dave", force=error is TerminalToolError, reason="fixed upstream")

    assert out.result == "completed", out
    assert counts == {"prep": 1, "flaky": 2}  # the recorded prep result reused, the failed call made again
    new = [le.event for le in accepted(log_of(topics, run_id)) if le.event.epoch == out.epoch]
    assert new[0].type is EventType.LEASE_ACQUIRED
    assert (new[0].attributes["operator"], new[0].attributes["reason"]) == ("dave", "fixed upstream")
    assert new[0].attributes["action"] == ("retry --force" if error is TerminalToolError else "retry")
    assert [e.call_id for e in new if e.type is EventType.TOOL_CALLED] == ["work/flaky/1"]
    assert new[-1].type is EventType.RUN_COMPLETED
    with pytest.raises(OperatorRefused, match="not FAILED"):
        retry_run(topics, app, run_id, by="dave")


def test_resolve_then_the_cli_requests_a_resume(topics: Settings, world: DemoWorld, tmp_path: Path) -> None:
    """``runlog resolve`` asks the resumer group to continue the run; a resumer completes it."""
    run_id, dk = _blocked_on_charge(topics, world, tmp_path, "inside:TOOL:pay/charge/0")
    cli = _runlog(topics, "resolve", run_id, "--effect", dk[:16], "--done", "--external-id", "ch-9",
                  "--by", "erin", "--reason", WHY, cwd=tmp_path)
    assert cli.returncode == 0, cli.stderr
    assert "resume requested" in cli.stdout
    group = f"t-op-{uuid.uuid4().hex[:6]}"
    with ResumerService(dataclasses.replace(topics, resumer_group=group), orders_app(world.client)) as svc:
        svc.serve(stop=lambda: bool(svc.outcomes), idle_exit_s=60)
    assert [o.result for o in svc.outcomes] == ["completed"]
    assert world.stats()["charges"] == 0


def test_a_cancelled_runs_in_doubt_charge_is_resolved_and_frees_the_key_for_another_run(
        topics: Settings, world: DemoWorld, tmp_path: Path) -> None:
    """Issue 24, item 5: an in-doubt effect of a cancelled run could never be resolved, so every later
    run asking for its delivery key stayed in doubt for good."""
    from runlog.schemas.errors import EffectInDoubt

    run_id, dk = _blocked_on_charge(topics, world, tmp_path, "inside:TOOL:pay/charge/0")
    cancel_run(topics, run_id, by="ann", reason="the customer gave up")
    app = orders_app(world.client)
    wf = app.registry.get("orders")
    with Runner.from_settings(topics, source=app.source) as runner, pytest.raises(EffectInDoubt):
        runner.run(wf, {"order": "o-1", "mode": "fixed"})  # same order: same delivery key, held in doubt
    assert world.stats()["charges"] == 0

    cli = _runlog(topics, "resolve", run_id, "--effect", dk[:20], "--not-done", "--by", "bob", "--reason",
                  "the provider has no such charge", "--json", cwd=tmp_path)
    assert cli.returncode == 0, cli.stderr
    doc = json.loads(cli.stdout)
    assert (doc["status"], doc["resume_requested"]) == ("CANCELLED", False)
    assert "stays CANCELLED" in doc["detail"]
    history = accepted(log_of(topics, run_id))
    assert history[-1].event.type is EventType.EFFECT_RESOLVED
    assert history[-1].state.status is RunStatus.CANCELLED and not history[-1].state.open_intents
    assert _ledger(topics, dk).status is EffectStatus.FAILED
    entries, _ = _audit_entries(topics, run_id, EventType.EFFECT_RESOLVED)
    assert [(e["by"], e["decision"]) for e in entries] == [("bob", "not_done")]

    with Runner.from_settings(topics, source=app.source) as runner:
        assert runner.run(wf, {"order": "o-1", "mode": "fixed"}).completed
    assert world.stats()["charges"] == 1
    # once decided it is no longer open: a second resolution is refused
    with pytest.raises(OperatorRefused, match="no open effect"):
        resolve_effect(topics, run_id, dk, done=False, external_id=None, by="bob", reason=WHY)
