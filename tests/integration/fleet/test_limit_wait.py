"""A call that its rate limit makes wait long waits durably, on the real broker and Redis: the run is
``WAITING`` for ``runlog.limit`` with no lease in Redis and no worker slot taken (a run submitted
meanwhile to a worker of concurrency 1 completes during the wait), the fleet wakes it when the limit
says it fits, and its ``TOOL_RESULT`` records the whole wait. A worker killed right after appending
the wait leaves the run to another worker, which wakes it once: one wait, one take, each call executed
once."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from runlog.processors.fleet import Client
from runlog.processors.inspect.log import run_history
from runlog.producers.internal import LIMIT, lease_key
from runlog.schemas import EventType, Settings
from tests.integration.fleet import _app
from tests.integration.fleet._members import _Member

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


def _waits(settings: Settings, run_id: str) -> list[dict[str, str]]:
    return [dict(le.event.attributes) for le in run_history(settings, run_id)
            if le.event.type is EventType.RUN_WAITING]


def _third_call_result(settings: Settings, run_id: str) -> dict[str, str]:
    found = [dict(le.event.attributes) for le in run_history(settings, run_id)
             if le.event.type is EventType.TOOL_RESULT and le.event.call_id == "ask/ask/2"]
    assert len(found) == 1, found
    return found[0]


def _executions(log: Path, run_id: str) -> list[str]:
    return [line.split()[1] for line in log.read_text().splitlines() if line.startswith(run_id)]


def _until(what: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not what():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_long_limit_wait_holds_no_lease_and_no_slot_and_records_the_whole_wait(
        fleet_settings: Settings, members: list[_Member], redis_client: redis.Redis, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    members.append(_Member(fleet_settings, _app.app_limited, concurrency=1))
    with Client(fleet_settings) as client:
        run = client.submit("metered", {"log": str(log)})
        _until(lambda: client.status(run.run_id).waiting_for == LIMIT, 60)
        began = time.monotonic()
        assert client.status(run.run_id).status == "WAITING"
        # the wait holds no lease: nobody's key is in Redis while the run waits
        assert not redis_client.exists(lease_key(fleet_settings.redis_prefix, run.run_id))
        # nor the worker's only slot: another run starts and completes during the wait
        other = client.submit("squares", {"n": 4})
        assert other.result(timeout=30).outputs["report"]["text"] == "4 squared is 16"
        assert time.monotonic() - began < 3.5  # within the wait (the third call fits ~4 s after the first)
        assert client.status(run.run_id).status == "WAITING"
        assert not redis_client.exists(lease_key(fleet_settings.redis_prefix, run.run_id))
        result = run.result(timeout=60)
    assert result.outputs["ask"] == {"answers": [0, 10, 20]}
    assert _executions(log, run.run_id) == ["ask/ask/0", "ask/ask/1", "ask/ask/2"]  # each call once
    [wait] = _waits(fleet_settings, run.run_id)
    assert (wait["signal"], wait["limit"]) == (LIMIT, "test:model")
    assert int(wait["deadline_ms"]) - int(wait["since_ms"]) > 2000  # longer than the in-thread bound
    waited = int(_third_call_result(fleet_settings, run.run_id)["limit_wait_ms"])
    assert 3000 <= waited < 15000, waited  # the durable wait counts, not only this execution's
    assert not [m.errors for m in members if m.errors]


def test_a_worker_killed_right_after_its_run_began_a_limit_wait_leaves_it_to_another_once(
        fleet_settings: Settings, members: list[_Member], redis_client: redis.Redis, tmp_path: Path) -> None:
    settings = fleet_settings.with_(lease_ttl_ms=2000)  # the dead worker's lease goes soon
    log = tmp_path / "calls.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNLOG_")}
    env.update(settings.to_env())
    env.update(RUNLOG_CRASH_AT="after:RUN_WAITING:ask/ask/2",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    with Client(settings) as client:
        run = client.submit("metered", {"log": str(log)})
        proc = subprocess.run([sys.executable, "-m", "runlog", "worker", "--app",
                               "tests.integration.fleet._app:app_limited", "--concurrency", "1"],
                              env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == -9, proc.stderr[-3000:]  # killed once the wait was on the log
        [wait] = _waits(settings, run.run_id)
        assert _executions(log, run.run_id) == ["ask/ask/0", "ask/ask/1"]
        members.append(_Member(settings, _app.app_limited, concurrency=1))  # another runner
        result = run.result(timeout=90)
        woke = time.time() * 1000
    assert result.outputs["ask"] == {"answers": [0, 10, 20]}
    assert _executions(log, run.run_id) == ["ask/ask/0", "ask/ask/1", "ask/ask/2"]  # the third call once
    assert len(_waits(settings, run.run_id)) == 1  # one wait: the resume took once, and it fit
    assert woke >= int(wait["deadline_ms"])  # not before the limit said it fits
    waited = int(_third_call_result(settings, run.run_id)["limit_wait_ms"])
    assert waited >= int(wait["deadline_ms"]) - int(wait["since_ms"]), waited
    assert not [m.errors for m in members if m.errors]
