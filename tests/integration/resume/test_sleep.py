"""Durable timers on the real broker and Redis: a run that sleeps holds no lease while it sleeps,
outlives its process (SIGKILLed), and is woken within 2 s of its wake time by a resumer member that
is not its process; also when the process died right after the sleep was recorded, before letting go."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from runlog.processors.demo.run import worker_env
from runlog.processors.inspect import run_history
from runlog.processors.resume import ResumeOutcome
from runlog.producers.internal import lease_key
from runlog.schemas import EventType, Settings
from tests.integration.resume._members import Member, until
from tests.integration.resume._sleeper import app

pytestmark = pytest.mark.integration

SLEEP_CALL = "nap/runlog.sleep/1"
SECONDS = 6.0


def _spawn(settings: Settings, crash_at: str | None) -> subprocess.Popen[str]:
    env = worker_env(settings, "http://127.0.0.1:9", crash_at)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[3]), env["PYTHONPATH"]])
    return subprocess.Popen([sys.executable, "-m", "tests.integration.resume._sleeper", str(SECONDS)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


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


@pytest.mark.parametrize("crash_at", [None, f"after:RUN_WAITING:{SLEEP_CALL}"], ids=["let-go", "killed-at-sleep"])
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
