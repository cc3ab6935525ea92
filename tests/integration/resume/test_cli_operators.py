"""``runlog signal``, ``approve``, ``reject`` and ``retry`` run as commands (``python -m runlog``):
their exit codes, what they append to the log, and that what they refuse appends nothing.
(``runlog.processors.signal`` and ``runlog.processors.operate`` are tested as functions in ``test_waits.py``
and
``test_operate.py``.)"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runlog.processors.demo.run import worker_env
from runlog.processors.operate import load_run
from runlog.processors.resume import Resumer
from runlog.producers import LocalArtifactStore, Runner
from runlog.projections import RunStatus
from runlog.schemas import EventType, RunEvent, Settings, TerminalToolError
from tests.integration.resume import _ops_app as ops
from tests.integration.resume.conftest import accepted, log_of

pytestmark = pytest.mark.integration

APP = "tests.integration.resume._ops_app:app"


def _runlog(settings: Settings, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runlog", *args], env=worker_env(settings, ""),
                          cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    ops.FAIL[0] = None
    ops.RUNS.clear()
    yield
    ops.FAIL[0] = None


def _waiting(settings: Settings) -> str:
    """A run of ``ops-approvals`` waiting for ``approval`` (no lease, no writer)."""
    with Runner.from_settings(settings, source=ops.app.source) as r:
        res = r.run(ops.approvals, {})
    assert res.waiting == "approval" and not res.completed
    return res.run_id


def _event(settings: Settings, run_id: str, seq: int) -> RunEvent:
    [ev] = [le.event for le in accepted(log_of(settings, run_id)) if le.event.seq == seq]
    return ev


def _data(settings: Settings, ev: RunEvent) -> Any:
    assert ev.payload_ref is not None
    return json.loads(LocalArtifactStore(settings.artifact_root).get(ev.payload_ref))


def _output(settings: Settings, run_id: str, stage: str) -> Any:
    [ev] = [le.event for le in accepted(log_of(settings, run_id))
            if le.event.type is EventType.VERIFIED and le.event.stage == stage]
    return _data(settings, ev)


def _resumed(settings: Settings, run_id: str) -> Any:
    with Resumer(settings, ops.app) as r:
        out = r.resume(run_id)
    assert out.result == "completed", out
    return _output(settings, run_id, "ask")


def test_signal_as_a_command_appends_the_signal_with_its_data_and_refusals_append_nothing(
        topics: Settings, tmp_path: Path) -> None:
    run_id = _waiting(topics)
    n = len(log_of(topics, run_id))

    def refused(*args: str, code: int = 1, says: str) -> None:
        p = _runlog(topics, "signal", run_id, *args, cwd=tmp_path)
        assert p.returncode == code and says in p.stderr, p
        assert len(log_of(topics, run_id)) == n

    refused("countersign", "--by", "alice", says="waits for signal 'approval', not 'countersign'")
    refused("approval", "--data", "{not json", "--by", "alice", says="--data is not JSON")
    refused("approval", "--by", "  ", says="--by is required")
    refused("approval", code=2, says="--by")  # argparse: the option is missing
    assert load_run(topics, run_id).status is RunStatus.WAITING  # type: ignore[union-attr]

    ok = _runlog(topics, "signal", run_id, "approval", "--data", '{"approved": true, "limit": 250}',
                 "--by", "alice", "--reason", "budget checked", "--json", cwd=tmp_path)

    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert (doc["run_id"], doc["action"]) == (run_id, "signal:approval")
    assert len(log_of(topics, run_id)) == n + 2  # the operator's lease, then the signal
    lease, ev = _event(topics, run_id, doc["seq"] - 1), _event(topics, run_id, doc["seq"])
    assert lease.type is EventType.LEASE_ACQUIRED and lease.epoch == ev.epoch == doc["epoch"]
    assert (lease.attributes["operator"], lease.attributes["action"]) == ("alice", "signal:approval")
    assert ev.type is EventType.SIGNAL_RECEIVED and ev.call_id is not None and ev.call_id.startswith("ask/")
    assert ev.attributes == {"signal": "approval", "by": "alice", "reason": "budget checked"}
    assert _data(topics, ev) == {"approved": True, "limit": 250}
    m = len(log_of(topics, run_id))
    again = _runlog(topics, "signal", run_id, "approval", "--by", "alice", cwd=tmp_path)
    assert again.returncode == 1 and "not waiting for a signal" in again.stderr, again
    assert len(log_of(topics, run_id)) == m

    assert _resumed(topics, run_id) == {"got": {"approved": True, "limit": 250}}


def test_approve_and_reject_as_commands_signal_approval_true_and_false(
        topics: Settings, tmp_path: Path) -> None:
    yes, no = _waiting(topics), _waiting(topics)
    n = len(log_of(topics, yes))
    other = _runlog(topics, "approve", yes, "--signal", "countersign", "--by", "bob", cwd=tmp_path)
    assert other.returncode == 1 and "not 'countersign'" in other.stderr, other
    assert len(log_of(topics, yes)) == n

    a = _runlog(topics, "approve", yes, "--by", "bob", "--reason", "looks right", cwd=tmp_path)
    r = _runlog(topics, "reject", no, "--by", "carol", "--json", cwd=tmp_path)

    assert a.returncode == 0, a.stderr
    assert a.stdout.startswith(f"{yes}: signal 'approval' delivered") and "resume requested" in a.stdout
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["action"] == "signal:approval"
    for run_id, who, why, approved in ((yes, "bob", "looks right", True), (no, "carol", "", False)):
        [ev] = [le.event for le in accepted(log_of(topics, run_id))
                if le.event.type is EventType.SIGNAL_RECEIVED]
        assert ev.seq == (n + 2 if run_id == yes else doc["seq"])
        assert ev.attributes == {"signal": "approval", "by": who, "reason": why}
        assert _data(topics, ev) == {"approved": approved}
    m = len(log_of(topics, yes))
    twice = _runlog(topics, "reject", yes, "--by", "carol", cwd=tmp_path)
    assert twice.returncode == 1 and "refused" in twice.stderr, twice
    assert len(log_of(topics, yes)) == m

    assert _resumed(topics, yes) == {"got": {"approved": True}}
    assert _resumed(topics, no) == {"got": {"approved": False}}


def test_retry_as_a_command_needs_by_and_force_for_a_terminal_failure_then_completes_the_run(
        topics: Settings, tmp_path: Path) -> None:
    ops.FAIL[0] = TerminalToolError
    with Runner.from_settings(topics, source=ops.app.source) as runner, pytest.raises(TerminalToolError):
        runner.run(ops.flaky_wf, {})
    ops.FAIL[0] = None
    [run_id] = ops.RUNS
    state = load_run(topics, run_id)
    assert state is not None and state.status is RunStatus.FAILED
    n = len(log_of(topics, run_id))

    nobody = _runlog(topics, "retry", run_id, "--app", APP, "--force", cwd=tmp_path)
    assert nobody.returncode == 2 and "--by" in nobody.stderr, nobody  # argparse: a required option
    unforced = _runlog(topics, "retry", run_id, "--app", APP, "--by", "dave", cwd=tmp_path)
    assert unforced.returncode == 1 and "--force" in unforced.stderr, unforced
    assert len(log_of(topics, run_id)) == n

    ok = _runlog(topics, "retry", run_id, "--app", APP, "--by", "dave", "--reason", "fixed upstream",
                 "--force", "--json", cwd=tmp_path)

    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert (doc["run_id"], doc["result"]) == (run_id, "completed")
    new = [le.event for le in accepted(log_of(topics, run_id)) if le.event.epoch == doc["epoch"]]
    assert new[0].type is EventType.LEASE_ACQUIRED
    assert {k: new[0].attributes[k] for k in ("operator", "action", "reason")} == \
        {"operator": "dave", "action": "retry --force", "reason": "fixed upstream"}
    assert [e.call_id for e in new if e.type is EventType.TOOL_CALLED] == ["work/ops_flaky/1"]
    assert new[-1].type is EventType.RUN_COMPLETED
    assert _output(topics, run_id, "work") == {"w": 20}
    m = len(log_of(topics, run_id))
    again = _runlog(topics, "retry", run_id, "--app", APP, "--by", "dave", cwd=tmp_path)
    assert again.returncode == 1 and "not FAILED" in again.stderr, again
    assert len(log_of(topics, run_id)) == m
