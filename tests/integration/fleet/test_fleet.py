"""A fleet on the real broker and Redis: a client submits runs, workers start and execute them, a third
party awaits their results; a key submitted twice is one run; a worker killed between taking a
submission and its ``RUN_STARTED`` leaves the run to the next worker, which starts it once."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from runlog.processors.fleet import SUBMITTED, Client, RunInfo
from runlog.processors.inspect.log import run_history
from runlog.schemas import EventType, RunConflict, Settings
from tests.integration.fleet import _app
from tests.integration.fleet._members import _Member

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]



def _started(settings: Settings, run_id: str) -> int:
    return sum(1 for le in run_history(settings, run_id) if le.event.type is EventType.RUN_STARTED)


async def _the_async_twins_answer_as_the_methods_do(client: Client, run_id: str, info: RunInfo) -> None:
    """The how-to's "every method has an a-prefixed twin": Client.astatus and astate were missing."""
    again = await client.asubmit("squares", {"n": 3, "hold_s": 1.5}, key="order-3", tenant="acme")
    assert (again.run_id, again.created) == (run_id, False)
    assert (await client.astatus(run_id)).status == "COMPLETED"
    state = await client.astate(run_id)
    assert state is not None and state == client.state(run_id)
    listed = await client.alist(tenant="acme")
    assert {i.run_id for i in listed} == {i.run_id for i in client.list(tenant="acme")}
    assert (await client.run(run_id).aresult(timeout=30)).completed
    assert (await client.run(run_id).astatus()).labels == info.labels


def test_submitted_runs_start_once_each_within_concurrency_and_any_client_awaits_them(
        fleet_settings: Settings, members: list[_Member]) -> None:
    _app.OVERLAP.most = 0
    with Client(fleet_settings, name="web") as web:
        first = [web.submit("squares", {"n": n, "hold_s": 1.5}, key=f"order-{n}", tenant="acme")
                 for n in range(6)]
        assert all(r.created for r in first)
        assert web.status(first[0].run_id).status == SUBMITTED  # durable, not started: no worker yet
        again = web.submit("squares", {"n": 3, "hold_s": 1.5}, key="order-3", tenant="acme")
        assert (again.run_id, again.created) == (first[3].run_id, False)
        with pytest.raises(RunConflict):
            web.submit("squares", {"n": 4000}, key="order-4")
        members.append(_Member(fleet_settings, _app.app, concurrency=2))
        with Client(fleet_settings, name="elsewhere") as reader:  # a third party, by run id alone
            results = [reader.run(r.run_id).result(timeout=90) for r in first]
        assert [r.outputs["report"]["text"] for r in results] == [f"{n} squared is {n * n}" for n in range(6)]
        assert all(r.completed for r in results)
        info = web.status(first[0].run_id)
        assert (info.status, info.workflow, info.version, info.labels) == (
            "COMPLETED", "squares", "1", {"queue": "default", "priority": "0", "tenant": "acme"})
        assert {i.run_id for i in web.list(tenant="acme")} == {r.run_id for r in first}
        asyncio.run(_the_async_twins_answer_as_the_methods_do(web, first[3].run_id, info))
    assert not [m.errors for m in members if m.errors]
    for r in first:
        assert _started(fleet_settings, r.run_id) == 1, r.run_id
    starts = [t.run_id for m in members for t in m.taken if t.outcome == "started"]
    assert sorted(starts) == sorted(r.run_id for r in first)  # each started once
    assert _app.OVERLAP.most == 2  # two at a time: in parallel, and never more than the worker's concurrency


def test_a_version_the_worker_does_not_serve_waits_for_a_member_that_does(
        fleet_settings: Settings, members: list[_Member]) -> None:
    members.append(_Member(fleet_settings, _app.app, concurrency=1))  # serves squares@1 only
    with Client(fleet_settings) as client:
        run = client.submit("squares", {"n": 5}, version="2")
        deadline = time.monotonic() + 30
        while not any(t.outcome == "parked" for t in members[0].taken):
            assert time.monotonic() < deadline, members[0].taken
            time.sleep(0.1)
        assert client.status(run.run_id).status == SUBMITTED
        members.append(_Member(fleet_settings, _app.app_v12, concurrency=1))
        result = run.result(timeout=60)
    assert result.outputs["report"] == {"text": "5 squared is 25", "version": "2"}
    assert _started(fleet_settings, run.run_id) == 1


@pytest.mark.parametrize("point", ["after:SUBMISSION:taken", "after:CLAIM:run"])
def test_a_worker_killed_between_taking_a_submission_and_its_start_leaves_one_run(
        fleet_settings: Settings, members: list[_Member], point: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNLOG_")}
    env.update(fleet_settings.to_env())
    env.update(RUNLOG_CRASH_AT=point,
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    with Client(fleet_settings) as client:
        run = client.submit("squares", {"n": 7})
        proc = subprocess.run([sys.executable, "-m", "runlog", "worker", "--app",
                               "tests.integration.fleet._app:app", "--concurrency", "1"],
                              env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == -9, proc.stderr[-3000:]  # killed at the point, the submission uncommitted
        assert _started(fleet_settings, run.run_id) == 0
        members.append(_Member(fleet_settings, _app.app, concurrency=1))  # the partition's next owner
        result = run.result(timeout=90)
    assert result.outputs["report"]["text"] == "7 squared is 49"
    assert _started(fleet_settings, run.run_id) == 1


def test_with_encryption_on_a_submission_travels_sealed_and_its_result_reads_back(
        fleet_settings: Settings, members: list[_Member], tmp_path: Path) -> None:
    from confluent_kafka import Consumer, TopicPartition

    sealed = fleet_settings.with_(encryption=True, keyring=str(tmp_path / "keyring"))
    planted = f"n-{uuid.uuid4().hex}"  # a parameter nobody may read on the topic
    members.append(_Member(sealed, _app.app, concurrency=1))
    with Client(sealed) as client:
        run = client.submit("squares", {"n": 6, "note": planted}, subject="customer-1")
        result = run.result(timeout=90)
    assert result.outputs["report"]["text"] == "6 squared is 36"
    c = Consumer(sealed.consumer_config(f"t-dump-{uuid.uuid4().hex[:6]}", **{"enable.auto.commit": False}))
    try:
        topic = f"{sealed.topic_prefix}runlog.submissions"
        values = []
        for p in range(sealed.partitions):
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            if hi > lo:
                c.assign([TopicPartition(topic, p, lo)])
                while len(values) < 1:
                    m = c.poll(10)
                    assert m is not None and m.error() is None
                    values.append(m.value())
    finally:
        c.close()
    assert len(values) == 1 and planted.encode() not in values[0] and b'"n"' not in values[0]
