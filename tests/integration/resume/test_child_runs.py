"""Child runs on the real broker and Redis: an orchestrator fans out to N children and gathers them,
with its process SIGKILLed during the fan-out and a resumer member's process SIGKILLed in the middle
of a child (after the child's effect, before its result is on the log). N is 20 to keep CI short
(the mechanism does not change with N); ``RUNLOG_TEST_CHILDREN=100`` runs the issue's hundred.

Asserted: exactly N children (one run per key, none twice), each child's effect executed once, the
parent completed with all N outputs in order, and the links on both logs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from runlog.processors.demo.run import worker_env
from runlog.processors.inspect import run_history, runs_from_log
from runlog.processors.resume import ResumeOutcome
from runlog.producers.internal import child_key, run_id_for_key, store_from_settings
from runlog.projections import RunStatus
from runlog.schemas import EventType, Settings
from tests.integration.processors.harness import start_projector, stop
from tests.integration.resume._members import Member, until
from tests.integration.resume._orchestra import app

pytestmark = [pytest.mark.integration, pytest.mark.slow]

N = int(os.environ.get("RUNLOG_TEST_CHILDREN", "20"))
PARENT_DIES_AT = "after:CHILD:fan/runlog.child/7"  # 8 children started, 12 not yet
CHILD_DIES_AT = "before:EFFECT_RESULT:work/publish/0"  # the first child this member executes


def _spawn(settings: Settings, crash_at: str, *args: str) -> subprocess.Popen[str]:
    env = worker_env(settings, "http://127.0.0.1:9", crash_at)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[3]), env["PYTHONPATH"]])
    return subprocess.Popen([sys.executable, "-m", "tests.integration.resume._orchestra", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _line(proc: subprocess.Popen[str], prefix: str, timeout: float = 60) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(prefix):
            return line.strip().partition("=")[2]
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"no {prefix!r} line (exit {proc.poll()}): "
                         f"{proc.stderr.read()[-2000:] if proc.stderr else ''}")


def test_fan_out_and_gather_with_the_parent_and_a_child_killed(topics: Settings, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    settings = topics.with_(lease_ttl_ms=1500, sweep_interval_ms=1000)
    monkeypatch.setenv("RUNLOG_REDIS_PREFIX", settings.redis_prefix)  # where the members here count effects
    r = redis.Redis.from_url(settings.redis_url)
    projector = start_projector(settings, f"children-{settings.redis_prefix}", log=tmp_path / "projector.log")
    member0 = _spawn(settings, CHILD_DIES_AT, "member", "m0")  # alone in the group: gets the first children
    parent = members = None
    t0 = time.monotonic()
    try:
        _line(member0, "assigned")
        parent = _spawn(settings, PARENT_DIES_AT, "parent", str(N))
        run_id = _line(parent, "run_id=")
        parent.wait(60)
        member0.wait(60)
        assert parent.returncode == -signal.SIGKILL, parent.stderr.read() if parent.stderr else ""
        assert member0.returncode == -signal.SIGKILL, member0.stderr.read() if member0.stderr else ""
        at_kill = [le.event for le in run_history(settings, run_id) if le.outcome.accepted]
        started = [e for e in at_kill if e.type is EventType.TOOL_CALLED and e.tool == "runlog.child"]
        assert len(started) == 8 and at_kill[-1].type is not EventType.RUN_WAITING  # died in the fan-out

        done: list[ResumeOutcome] = []
        members = [Member(settings, app(), f"m{i}", done) for i in (1, 2)]
        store = store_from_settings(settings)

        def parent_completed() -> bool:
            return any(o.run_id == run_id and o.result == "completed" for o in done)

        until(parent_completed, "the parent's completion", members, timeout=75)
        print(f"{N} children gathered in {time.monotonic() - t0:.1f} s with both kills")

        history = [le.event for le in run_history(settings, run_id) if le.outcome.accepted]
        assert history[-1].type is EventType.RUN_COMPLETED
        calls = [e for e in history if e.type is EventType.TOOL_CALLED and e.tool == "runlog.child"]
        assert [e.call_id for e in calls] == [f"fan/runlog.child/{i}" for i in range(N)]  # each once
        ids = [e.attributes["runlog.child_run_id"] for e in calls]
        assert ids == [run_id_for_key(child_key(run_id, f"fan/runlog.child/{i}", f"item-{i}"))
                       for i in range(N)]
        fan = next(e for e in history if e.type is EventType.VERIFIED and e.stage == "fan")
        assert fan.payload_ref is not None
        outputs = json.loads(store.get(fan.payload_ref))["outputs"]
        assert [o["item"] for o in outputs] == list(range(N))
        assert [o["square"] for o in outputs] == [i * i for i in range(N)]

        everything = runs_from_log(settings)
        children = {k: s for k, s in everything.items() if s.parent_run_id == run_id}
        assert sorted(children) == sorted(ids)  # N children exactly: no second run for any key
        for i, child in enumerate(ids):
            s = children[child]
            assert s.status is RunStatus.COMPLETED and s.parent_call == f"fan/runlog.child/{i}"
        published = [int(r.get(f"{settings.redis_prefix}:test:published:{i}") or 0) for i in range(N)]
        assert published == [1] * N, published  # every child's effect once
        reconciled = [k for k in ids if any(le.event.type is EventType.EFFECT_RECONCILED
                                            for le in run_history(settings, k))]
        assert len(reconciled) == 1  # the child killed after its effect: reconciled, not published again

        shown = subprocess.run([sys.executable, "-m", "runlog", "show", run_id, "--json"],
                               env=worker_env(settings, "http://127.0.0.1:9"), capture_output=True, text=True,
                               timeout=60)
        assert shown.returncode == 0, shown.stderr
        doc = json.loads(shown.stdout)
        assert [c["run_id"] for c in doc["children"]] == ids
        assert {c["status"] for c in doc["children"]} == {"COMPLETED"}
        child_doc = json.loads(subprocess.run(
            [sys.executable, "-m", "runlog", "show", ids[0], "--json"],
            env=worker_env(settings, "http://127.0.0.1:9"), capture_output=True, text=True,
            timeout=60).stdout)
        assert child_doc["parent"] == {"run_id": run_id, "call_id": "fan/runlog.child/0"}
    finally:
        for proc in (parent, member0):
            if proc is not None:
                if proc.poll() is None:
                    proc.kill()
                proc.communicate(timeout=10)
        for m in members or []:
            m.leave()
        stop(projector)
        r.close()
