"""Durable waits: ``ctx.wait_for`` lets go of the run (no lease, no thread), a signal on the log
continues it through the resumer, the signal's data is a recorded result, a timeout follows its
declared policy, and a thousand waiting runs cost nothing but their keys."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

from runlog.processors.inspect import run_history
from runlog.processors.operate import OperatorRefused
from runlog.processors.resume import App, Resumer, ResumerService
from runlog.processors.signal import approve_run, signal_run
from runlog.producers import CallInfo, DictInputSource, Runner, StageContext, Workflow, tool
from runlog.schemas import EventType, ReplayPolicy, Settings

pytestmark = pytest.mark.integration

shipped: list[dict[str, Any]] = []


@tool("ship", policy=ReplayPolicy.NEVER, target="shipping:parcels",
      delivery=lambda a, c: ("acct-waits", "shipping", str(a["order"]), "1"))
def ship(call: CallInfo, order: str, approved: bool) -> Any:
    shipped.append({"order": order, "approved": approved})
    return {"external_id": f"parcel-{order}"}


def _workflow(timeout: float | None = None, on_timeout: str = "fail") -> Workflow:
    wf = Workflow("approvals", version="1")

    @wf.stage("ask")
    def ask(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        first = ctx.wait_for("approval", timeout=timeout, on_timeout=on_timeout, default={"approved": False})
        second = ctx.wait_for("countersign") if ctx.params.get("two") else {"by": "nobody"}
        rec = ctx.call(ship, order=ctx.params["order"], approved=bool(first["approved"]))
        return {"approved": first["approved"], "countersigned_by": second.get("by"),
                "parcel": rec["external_id"]}

    return wf


def _app(wf: Workflow) -> App:
    return App.of([wf], [ship], DictInputSource({}))


@pytest.fixture(autouse=True)
def _reset() -> None:
    shipped.clear()


@pytest.fixture
def runner(topics: Settings) -> Iterator[Runner]:
    with Runner.from_settings(topics) as r:
        yield r


def _types(settings: Settings, run_id: str) -> list[EventType]:
    return [le.event.type for le in run_history(settings, run_id) if le.outcome.accepted]


def _leases(settings: Settings) -> int:
    r = redis.Redis.from_url(settings.redis_url)
    try:
        return sum(1 for _ in r.scan_iter(match=f"{settings.redis_prefix}:*:lease", count=1000))
    finally:
        r.close()


def test_a_wait_lets_go_and_a_signal_continues_the_run_with_its_data_recorded(
        topics: Settings, runner: Runner) -> None:
    wf = _workflow()
    res = runner.run(wf, {"order": "o-1", "two": True})
    assert res.waiting == "approval" and not res.completed
    run_id = res.run_id
    assert _types(topics, run_id)[-1] is EventType.RUN_WAITING
    assert _leases(topics) == 0
    assert shipped == []

    with pytest.raises(OperatorRefused, match="waits for signal 'approval', not 'countersign'"):
        signal_run(topics, run_id, "countersign", {"by": "x"}, by="bob")
    with pytest.raises(OperatorRefused, match="--by"):
        approve_run(topics, run_id, by="")
    before = _types(topics, run_id)
    assert before[-1] is EventType.RUN_WAITING  # refusals appended nothing

    out = approve_run(topics, run_id, by="alice", reason="looks right", runner=runner)
    assert out.action == "signal:approval"
    with Resumer(topics, _app(wf), runner=runner) as r:
        first = r.resume(run_id)
        assert first.result == "waiting" and "countersign" in first.detail  # approval read, next wait
        assert r.resume(run_id).result == "waiting"  # nothing to do before the signal: no lease taken
        signal_run(topics, run_id, "countersign", {"by": "carol"}, by="carol", runner=runner)
        done = r.resume(run_id)
    assert done.result == "completed", done
    assert shipped == [{"order": "o-1", "approved": True}]
    history = [le for le in run_history(topics, run_id) if le.outcome.accepted]
    signals = [le.event for le in history if le.event.type is EventType.SIGNAL_RECEIVED]
    assert [(e.attributes["signal"], e.attributes["by"]) for e in signals] == [("approval", "alice"),
                                                                            ("countersign", "carol")]
    # the approval's data was recorded once and reused by the later resume: one TOOL_CALLED per wait
    waits = [le.event.call_id for le in history if le.event.type is EventType.TOOL_CALLED
             and le.event.tool == "runlog.wait"]
    assert waits == ["ask/runlog.wait/0", "ask/runlog.wait/1"]
    assert history[-1].state.stage_outputs  # verified
    with pytest.raises(OperatorRefused, match="COMPLETED"):
        approve_run(topics, run_id, by="alice")


@pytest.mark.parametrize("policy", ["default", "fail"])
def test_a_timed_out_wait_follows_its_policy(topics: Settings, runner: Runner, policy: str) -> None:
    wf = _workflow(timeout=0.5, on_timeout=policy)
    res = runner.run(wf, {"order": f"o-{policy}"})
    assert res.waiting == "approval"
    time.sleep(0.7)
    service = ResumerService(topics.with_(sweep_interval_ms=0), _app(wf))
    try:
        report = service.sweep()
        assert res.run_id in report.requested
        assert res.run_id not in service.sweep().requested  # asked once
    finally:
        service.close()
    with Resumer(topics, _app(wf), runner=runner) as r:
        out = r.resume(res.run_id)
    types = _types(topics, res.run_id)
    if policy == "default":
        assert out.result == "completed", out
        assert shipped == [{"order": "o-default", "approved": False}]
        sig = next(le.event for le in run_history(topics, res.run_id)
                   if le.event.type is EventType.SIGNAL_RECEIVED)
        assert sig.attributes["timed_out"] == "true"
    else:
        assert out.result == "failed" and "timed out" in out.detail
        assert types[-1] is EventType.FAILED and shipped == []


@pytest.mark.slow
def test_a_thousand_waiting_runs_hold_no_thread_and_no_lease_and_all_complete(topics: Settings) -> None:
    # eight operators and resumers at once in one process, on a machine the rest of the suite loads: a
    # lease's heartbeat thread may wait seconds for a turn, so the leases outlive such a wait (what is
    # counted here is leases and threads held, not how soon a dead holder's lease ends)
    topics = topics.with_(lease_ttl_ms=15_000)
    with Runner.from_settings(topics) as runner:
        _thousand_waiting_runs(topics, runner)


def _thousand_waiting_runs(topics: Settings, runner: Runner) -> None:
    n = 1000
    wf = _workflow()
    threads_before = threading.active_count()
    t0 = time.monotonic()
    ids = [runner.run(wf, {"order": f"o-{i}"}).run_id for i in range(n)]
    started = time.monotonic() - t0
    assert threading.active_count() <= threads_before + 1  # the lease heartbeat thread at most
    assert _leases(topics) == 0
    r = redis.Redis.from_url(topics.redis_url)
    try:
        assert r.zcard(f"{topics.redis_prefix}:runs:active") == 0  # nothing for a sweep to resume
    finally:
        r.close()
    t1 = time.monotonic()

    def approve_and_resume(chunk: list[str]) -> list[str]:
        with Resumer(topics, _app(wf), runner=runner) as res:
            out = []
            for run_id in chunk:
                approve_run(topics, run_id, by="ops", runner=runner)
                out.append(res.resume(run_id).result)
            return out

    with ThreadPoolExecutor(8) as pool:  # the operators and resumers of a platform, not one loop
        outcomes = [o for part in pool.map(approve_and_resume, [ids[i::8] for i in range(8)]) for o in part]
    finished = time.monotonic() - t1
    assert outcomes == ["completed"] * n
    assert len(shipped) == n and all(s["approved"] for s in shipped)
    assert _leases(topics) == 0
    print(f"{n} runs: started and waiting in {started:.1f} s, approved and completed in {finished:.1f} s; "
          f"threads {threads_before} -> {threading.active_count()}", flush=True)


def test_a_signal_after_a_slow_read_of_the_runs_tail_is_delivered(topics: Settings, runner: Runner,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """An operator's lease goes longer than its heartbeat allows without one while the run's tail is read
    (a loaded machine: the heartbeat thread waits for its turn): the lease is extended before the
    signal is appended, so the approval is delivered instead of refused with LeaseLost."""
    import runlog.processors.operate as operate

    wf = _workflow()
    res = runner.run(wf, {"order": "o-slow-tail"})
    assert res.waiting == "approval"
    read = operate.read_run_tail

    def starved(*args: Any, **kwargs: Any) -> Any:
        got = read(*args, **kwargs)
        for lease in list(runner.leases._leases.values()):  # no heartbeat for most of the ttl
            lease._last_ok -= topics.lease_ttl_ms / 1000 * 0.8
        return got

    monkeypatch.setattr(operate, "read_run_tail", starved)
    out = approve_run(topics, res.run_id, by="ops", runner=runner)
    assert out.action == "signal:approval"
    assert _types(topics, res.run_id)[-1] is EventType.SIGNAL_RECEIVED
