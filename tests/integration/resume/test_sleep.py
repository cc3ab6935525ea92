"""Durable timers on the real broker and Redis: a run that sleeps holds no lease while it sleeps,
outlives its process (SIGKILLed), and is woken within 2 s of its wake time by a resumer member that
is not its process; also when the process died right after the sleep was recorded, before letting go."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis

from runlog.processors.demo.run import worker_env
from runlog.processors.inspect import run_history
from runlog.processors.metrics import ResumerMetrics
from runlog.processors.resume import ResumeOutcome
from runlog.processors.resume._timers import Timers
from runlog.producers import Runner
from runlog.producers.internal import ActiveRuns, lease_key
from runlog.projections import RedisStore
from runlog.projections.rebuild import replay_into
from runlog.schemas import EventType, Settings
from tests.integration.resume._members import Member, until
from tests.integration.resume._sleeper import app

pytestmark = pytest.mark.integration

SLEEP_CALL = "nap/runlog.sleep/1"
SECONDS = 6.0


def _env(settings: Settings, crash_at: str | None) -> dict[str, str]:
    env = worker_env(settings, "http://127.0.0.1:9", crash_at)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[3]), env["PYTHONPATH"]])
    return env


def _spawn(settings: Settings, crash_at: str | None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.integration.resume._sleeper", str(SECONDS)],
                            env=_env(settings, crash_at), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _line(proc: subprocess.Popen[str], prefix: str, timeout: float = 60) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(prefix):
            return line.strip().split("=", 1)[1]
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"the sleeper printed no {prefix!r} (exit {proc.poll()}): "
                         f"{proc.stderr.read()[-2000:] if proc.stderr else ''}")


@pytest.mark.parametrize("crash_at", [None, f"after:RUN_WAITING:{SLEEP_CALL}"],
                         ids=["let-go", "killed-at-sleep"])
def test_a_sleeping_run_holds_no_lease_outlives_its_process_and_wakes_on_time(
        topics: Settings, crash_at: str | None) -> None:
    settings = topics.with_(lease_ttl_ms=1500, sweep_interval_ms=1000)
    done: list[ResumeOutcome] = []
    members = [Member(settings, app(), f"m{i}", done) for i in range(2)]
    r = redis.Redis.from_url(settings.redis_url)
    proc = _spawn(settings, crash_at)
    try:
        run_id = _line(proc, "run_id=")
        if crash_at is None:
            assert _line(proc, "waiting=") == "runlog.sleep"
            proc.send_signal(signal.SIGKILL)  # the run's process is gone for good
        proc.wait(60)
        assert proc.returncode == -signal.SIGKILL
        history = [le.event for le in run_history(settings, run_id) if le.outcome.accepted]
        [wait] = [e for e in history if e.type is EventType.RUN_WAITING]
        wake_ms = int(wait.attributes["deadline_ms"])
        called = next(e for e in history if e.type is EventType.TOOL_CALLED and e.call_id == SLEEP_CALL)
        assert int(called.attributes["wake_at_ms"]) == wake_ms
        # no lease while it sleeps (a process killed holding it: not after its ttl ran out)
        if crash_at is not None:
            until(lambda: not r.exists(lease_key(settings.redis_prefix, run_id)), "the dead writer's lease",
                  members, timeout=10)
        if crash_at is None:  # runlog show gives the sleeping run's wake time
            shown = subprocess.run([sys.executable, "-m", "runlog", "show", run_id], env=_env(settings, None),
                                   capture_output=True, text=True, timeout=60)
            iso = datetime.fromtimestamp(wake_ms / 1000, UTC).isoformat(timespec="seconds")
            assert shown.returncode == 0, shown.stderr
            assert f"reason: sleeping until {iso}" in shown.stdout, shown.stdout
            assert f"sleeping until {iso}" in shown.stdout.split("calls:", 1)[1]
        held = []
        while time.time() * 1000 < wake_ms - 300:
            held.append(bool(r.exists(lease_key(settings.redis_prefix, run_id))))
            time.sleep(0.1)
        assert held and not any(held), "a lease was held during the sleep"
        until(lambda: any(o.run_id == run_id and o.result == "completed" for o in done), "the wake-up",
              members, timeout=SECONDS + 20)
        history = [le.event for le in run_history(settings, run_id) if le.outcome.accepted]
        [woke] = [e for e in history if e.type is EventType.SIGNAL_RECEIVED and e.call_id == SLEEP_CALL]
        late_ms = woke.occurred_at - wake_ms
        print(f"woken {late_ms} ms after the wake time ({crash_at or 'let go'})")
        assert 0 <= late_ms <= 2000, late_ms
        assert history[-1].type is EventType.RUN_COMPLETED
        assert [e.call_id for e in history if e.type is EventType.TOOL_CALLED].count(SLEEP_CALL) == 1
        assert sum(1 for e in history if e.type is EventType.RUN_WAITING) == 1  # slept once
        completions = [o for o in done if o.run_id == run_id and o.result == "completed"]
        assert len(completions) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)  # reaps it and closes its pipes
        for m in members:
            m.leave()
        r.close()


def test_a_lost_timer_index_is_rebuilt_from_the_log(topics: Settings) -> None:
    """Redis loses the timer index (the waiting set) while a run sleeps: the projection, replayed
    from the log, re-arms it and a member wakes the run at its recorded time."""
    settings = topics.with_(sweep_interval_ms=60_000)  # the sweep is no help here: only the timers
    with Runner.from_settings(settings) as runner:
        h = runner.start_run(app().registry.get("sleeper"), {"seconds": 4.0})
        assert h.session is not None
        assert runner.execute(h.session).waiting == "runlog.sleep"
    r = redis.Redis.from_url(settings.redis_url)
    store = RedisStore.from_settings(settings)
    active = ActiveRuns(r, settings.redis_prefix)
    try:
        assert r.delete(active.waiting_key) == 1  # the index is gone; the log is not
        replay_into(settings, store)
        requested: list[str] = []
        timers = Timers(active=active, projection=store, workflows=app().registry.names,
                        request=lambda run_id, why: requested.append(run_id), metrics=ResumerMetrics())
        assert timers.restore() == 1 and timers.restore() == 0
        assert timers.fire_due() == []  # not yet
        done: list[ResumeOutcome] = []
        member = Member(settings, app(), "m0", done)
        try:
            until(lambda: any(o.run_id == h.run_id and o.result == "completed" for o in done), "the wake-up",
                  [member], timeout=20)
        finally:
            member.leave()
        history = [le.event for le in run_history(settings, h.run_id) if le.outcome.accepted]
        [wait] = [e for e in history if e.type is EventType.RUN_WAITING]
        [woke] = [e for e in history if e.type is EventType.SIGNAL_RECEIVED]
        assert 0 <= woke.occurred_at - int(wait.attributes["deadline_ms"]) <= 2000
    finally:
        store.client.close()
        r.close()
