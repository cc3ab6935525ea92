"""Drains (issue #25 item 4): ``runlog versions``, ``runlog doctor``'s warning and the gauge
``runlog_resumer_open_runs`` over a real Redis projection and the version routing keys.

The projection holds runs of ``orders@1`` (running and parked with no live member, waiting, failed),
of ``orders@2`` (running, completed) and of ``article@3`` (completed only); a live member serves
``orders@2`` and ``orders@3``, a member that stopped advertising long ago served ``orders@1``.
What each test would catch: a version left out (one only served, one only needed), open runs
counted by the wrong status or version, completed runs counted, a stale member taken for a live
one, the parked runs or the stalest run missing, no warning (or a failure) from doctor, a drained
version not said to be removable, a gauge not refreshed by the resumer or counted by every member.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid

import pytest
import redis

from runlog.processors.cli import main
from runlog.processors.metrics import ResumerMetrics
from runlog.processors.resume import ResumerService
from runlog.processors.resume._drains import OPEN_RUNS_S, OpenRunsGauge
from runlog.processors.resume._versions import LIVE_MS, VersionRoutes
from runlog.projections import RedisStore
from runlog.schemas import EventType, Settings, WorkflowSpec
from tests.integration.resume._toy import toy
from tests.unit.projections.runlogs import WORKFLOW, RunBuilder
from tests.unit.projections.store_contract import fold_updates

pytestmark = pytest.mark.integration


def _wf(name: str, version: str) -> WorkflowSpec:
    return dataclasses.replace(WORKFLOW, name=name, version=version)


def _project(store: RedisStore, b: RunBuilder) -> RunBuilder:
    store.apply(fold_updates(b.events))
    return b


def _end(store: RedisStore, b: RunBuilder, end: EventType) -> None:
    """Append ``end`` to the run ``b`` projected and apply it (the update after the stored state)."""
    b.add(end)
    store.apply(fold_updates(b.events)[-1:])


def populate(store: RedisStore, routes: VersionRoutes) -> dict[str, RunBuilder]:
    now = int(time.time() * 1000)
    waiting = RunBuilder("o1-c-waiting").start(_wf("orders", "1"))
    waiting.add(EventType.RUN_WAITING, stage="research", call_id="o1-c-waiting/research/0",
                attributes={"signal": "approval"})
    runs = [_project(store, b) for b in (
        RunBuilder("o1-a-running").start(_wf("orders", "1")),  # the stalest: one event
        RunBuilder("o1-b-failed").start(_wf("orders", "1")).fail("research"),
        waiting,
        RunBuilder("o2-a-running").start(_wf("orders", "2")).stage("research"),
        RunBuilder("o2-b-done").start(_wf("orders", "2")).complete(),
        RunBuilder("art-done").start(_wf("article", "3")).complete())]
    routes.park("o1-a-running", "orders@1")
    routes.advertise("m-v2", ["orders@2", "orders@3"])
    routes.advertise("m-gone", ["orders@1"], now_ms=now - 2 * LIVE_MS)
    return {b.run_id: b for b in runs}


def _env(s: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in s.to_env().items():
        monkeypatch.setenv(k, v)


def _out(capsys: pytest.CaptureFixture[str], *argv: str, code: int = 0) -> str:
    capsys.readouterr()
    assert main(list(argv)) == code
    return capsys.readouterr().out


def test_versions_lists_open_runs_parked_runs_and_members_and_doctor_warns_of_unserved_ones(
        topics: Settings, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    store = RedisStore(redis_client, topics.redis_prefix)
    routes = VersionRoutes(redis_client, topics.redis_prefix)
    runs = populate(store, routes)
    _env(topics, monkeypatch)

    rows = {r["version"]: r for r in json.loads(_out(capsys, "versions", "--json"))}
    assert list(rows) == ["orders@1", "orders@2", "orders@3"]  # article@3: no open run, no member
    v1, v2, v3 = rows["orders@1"], rows["orders@2"], rows["orders@3"]
    assert v1["runs"] == {"PENDING": 0, "RUNNING": 1, "WAITING": 1, "BLOCKED": 0, "FAILED": 1}
    assert (v1["open"], v1["parked"], v1["members"], v1["unserved"], v1["drained"]) == (3, 1, [], True, False)
    assert v1["oldest_open_run"]["run_id"] == "o1-a-running" and v1["oldest_open_run"]["age_s"] > 0
    assert (v2["runs"]["RUNNING"], v2["open"], v2["members"], v2["unserved"]) == (1, 1, ["m-v2"], False)
    assert (v3["open"], v3["members"], v3["drained"], v3["oldest_open_run"]) == (0, ["m-v2"], True, None)
    assert [r["version"] for r in json.loads(_out(capsys, "versions", "--json", "--workflow", "orders@2"))] \
        == ["orders@2"]

    text = _out(capsys, "versions")
    head, first, problem, *rest = text.splitlines()
    assert head.split()[:7] == ["version", "PENDING", "RUNNING", "WAITING", "BLOCKED", "FAILED", "open"]
    assert first.startswith("orders@1") and first.split()[1:7] == ["0", "1", "1", "0", "1", "3"]
    assert "o1-a-running (" in first and first.endswith("none live")
    assert problem == ("    no live member serves orders@1: 3 open runs (RUNNING 1, WAITING 1, FAILED 1; "
                       "1 parked) wait until a resumer whose App registers it joins")
    assert rest[0].startswith("orders@2") and rest[0].endswith("m-v2")

    # doctor: a warning naming the version and its open runs, not a failure
    doc = json.loads(_out(capsys, "doctor", "--json"))
    assert doc["ok"] is True and doc["versions"]["checked"] is True
    assert doc["versions"]["unserved"] == [{"version": "orders@1", "open": 3, "parked": 1,
                                            "runs": {"RUNNING": 1, "WAITING": 1, "FAILED": 1}}]
    (warning,) = doc["warnings"]
    assert warning.startswith("no live member serves orders@1: 3 open runs")
    text = _out(capsys, "doctor")
    assert "warning: no live member serves orders@1: 3 open runs" in text
    assert text.rstrip().endswith("doctor: no problems, 1 warning (not failures: exit 0)")

    # a member serving orders@1 joins: no warning; its runs end: orders@1 is drained, removable
    routes.advertise("m-v1", ["orders@1"])
    assert json.loads(_out(capsys, "doctor", "--json"))["warnings"] == []
    assert "doctor: all good" in _out(capsys, "doctor")
    for run_id, end in (("o1-a-running", EventType.RUN_COMPLETED), ("o1-b-failed", EventType.RUN_CANCELLED),
                        ("o1-c-waiting", EventType.RUN_CANCELLED)):
        _end(store, runs[run_id], end)
    routes.settle(["o1-a-running"])
    rows = {r["version"]: r for r in json.loads(_out(capsys, "versions", "--json"))}
    assert (rows["orders@1"]["open"], rows["orders@1"]["drained"], rows["orders@1"]["members"]) \
        == (0, True, ["m-v1"])
    text = _out(capsys, "versions")
    assert "    no open runs of orders@1: it can leave the App once no writer starts it" in text
    assert "no open runs of orders@2" not in text and "no open runs of orders@3" not in text  # the newest


def test_doctor_does_not_count_a_projection_that_is_not_ready_and_versions_reads_the_log(
        topics: Settings, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    store = RedisStore(redis_client, topics.redis_prefix)
    populate(store, VersionRoutes(redis_client, topics.redis_prefix))
    redis_client.hset(store.marker_key, "state", "rebuilding")
    _env(topics, monkeypatch)
    doc = json.loads(_out(capsys, "doctor", "--json"))
    assert doc["versions"]["checked"] is False and "marked 'rebuilding'" in doc["versions"]["note"]
    assert doc["warnings"] == [] and doc["ok"] is True
    capsys.readouterr()
    assert main(["versions", "--json"]) == 0
    out = capsys.readouterr()
    assert "open runs read from the events topic" in out.err
    rows = {r["version"]: r for r in json.loads(out.out)}  # the topic is empty: parked runs and members
    assert (rows["orders@1"]["open"], rows["orders@1"]["parked"]) == (0, 1)
    assert list(rows) == ["orders@1", "orders@2", "orders@3"]


def test_the_open_runs_gauge_is_counted_by_one_member_per_period(
        topics: Settings, redis_client: redis.Redis) -> None:
    store = RedisStore(redis_client, topics.redis_prefix)
    populate(store, VersionRoutes(redis_client, topics.redis_prefix))
    m1, m2 = ResumerMetrics(), ResumerMetrics()
    g1, g2 = OpenRunsGauge(store, m1.open_runs, "m1"), OpenRunsGauge(store, m2.open_runs, "m2")
    assert g1.refresh() and g2.refresh()
    for m in (m1, m2):
        def v(wf: str, version: str, status: str, m: ResumerMetrics = m) -> float | None:
            return m.registry.get_sample_value("runlog_resumer_open_runs",
                                               {"workflow": wf, "version": version, "status": status})

        assert [v("orders", "1", st) for st in ("RUNNING", "FAILED", "BLOCKED")] == [1, 1, 0]
        assert v("orders", "2", "RUNNING") == 1
        assert v("article", "3", "RUNNING") is None  # no open run: never labelled
    assert not g1.refresh()  # within OPEN_RUNS_S: nothing read
    # m1 counted this period: m2 sets its gauge from m1's count, not from the projection
    _project(store, RunBuilder("o2-c-running").start(_wf("orders", "2")))
    assert g2.refresh(force=True)
    assert m2.registry.get_sample_value(
        "runlog_resumer_open_runs", {"workflow": "orders", "version": "2", "status": "RUNNING"}) == 1
    assert json.loads(redis_client.get(g1.cache_key) or "{}")["by"] == "m1"
    redis_client.delete(g1.lock_key)  # the next period: whoever comes first counts again
    assert g2.refresh(force=True)
    assert m2.registry.get_sample_value(
        "runlog_resumer_open_runs", {"workflow": "orders", "version": "2", "status": "RUNNING"}) == 2
    assert OPEN_RUNS_S <= 10


def test_a_resumer_member_refreshes_the_open_runs_gauge(topics: Settings, redis_client: redis.Redis) -> None:
    store = RedisStore(redis_client, topics.redis_prefix)
    populate(store, VersionRoutes(redis_client, topics.redis_prefix))
    s = topics.with_(resumer_group=f"t-drain-{uuid.uuid4().hex[:8]}")
    service = ResumerService(s, toy("other").app())  # the gauge counts every workflow
    stop = threading.Event()
    labels = {"workflow": "orders", "version": "1", "status": "WAITING"}
    t = threading.Thread(target=service.serve, kwargs={"stop": stop.is_set}, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 30
        while service.metrics.registry.get_sample_value("runlog_resumer_open_runs", labels) is None:
            assert time.monotonic() < deadline, "the member never set runlog_resumer_open_runs"
            time.sleep(0.2)
        assert service.metrics.registry.get_sample_value("runlog_resumer_open_runs", labels) == 1
    finally:
        stop.set()
        t.join(30)
        service.close()
