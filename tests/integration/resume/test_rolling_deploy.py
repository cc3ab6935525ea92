"""A rolling deploy under load (issue #25, item 1): several versions of a workflow served at once.

Members serving ``orders@1`` work a stream of order runs with effects (SAFE quote, IDEMPOTENT
reserve, NEVER charge, RECONCILE_FIRST email), most of them crashed in-process at the end of a
stage; members serving ``orders@1`` and ``orders@2`` join, new runs start on version 2; the
version-1 members leave. Every member shares one resumer group (named by workflow names), so a
version-2 run's resume request often lands on a version-1 member: it must leave the run to a member
serving version 2 (park it), never block it. Then: no run ``BLOCKED``, every run completed on the
version it started on, one charge, one reservation and one confirmation per order. Real broker,
Redis and demo world.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from runlog.processors.cli import main
from runlog.processors.resume import App, ResumeOutcome, Resumer
from runlog.processors.resume._versions import VersionRoutes
from runlog.producers import Runner
from runlog.projections import RunStatus
from runlog.schemas import EventType, Settings, partition_for
from runlog.schemas._redis import redis_client
from tests.integration.resume._members import Member, until
from tests.integration.resume._orders import orders_app
from tests.integration.resume._toy import Abandon
from tests.integration.resume.conftest import DemoWorld, log_of, project

pytestmark = pytest.mark.integration

POINTS = ("pick", "pay", None, "notify")
"""Where each order's first execution crashes, in turn (None: it completes at once)."""


class _Crashes:
    """Orders whose first execution crashes at the end of a stage (after its calls), once."""

    def __init__(self) -> None:
        self._at: dict[str, str] = {}
        self._lock = threading.Lock()

    def arm(self, order: str, stage: str) -> None:
        with self._lock:
            self._at[order] = stage

    def __call__(self, stage: str, params: Mapping[str, Any]) -> None:
        with self._lock:
            if self._at.get(params["order"]) != stage:
                return
            del self._at[params["order"]]
        raise Abandon(f"order {params['order']}: crashed at the end of {stage}")


def _start(settings: Settings, app: App, crashes: _Crashes, orders: list[str],
           started: dict[str, tuple[str, str]]) -> None:
    """Start one run per order on the App's newest version; most crash once (see POINTS)."""
    wf = app.registry.get("orders")
    for i, order in enumerate(orders):
        point = POINTS[i % len(POINTS)]
        if point is not None:
            crashes.arm(order, point)
        runner = Runner.from_settings(settings, source=app.source)
        try:
            h = runner.start_run(wf, {"order": order, "mode": "ctx"})
            started[h.run_id] = (order, wf.version)
            assert h.session is not None
            with contextlib.suppress(Abandon):  # the crash: nothing more is appended
                runner.execute(h.session, release=False)
        finally:
            runner.close()  # a crashed run's lease expires after its ttl: the sweep finds it


def _v2_run_for_a_v1_member(settings: Settings, app: App, crashes: _Crashes, old: list[Member],
                            started: dict[str, tuple[str, str]]) -> str:
    """Start crashing version-2 runs until one's resume requests are bound for a partition a
    version-1 member owns (the runs above land wherever their ids hash): such a member is then
    handed a version-2 run for certain. Returns its id."""
    for i in range(40):
        before = set(started)
        _start(settings, app, crashes, [f"h{i}"], started)  # POINTS[0]: crashes at the end of "pick"
        (run_id,) = set(started) - before
        owned = frozenset().union(*(m.service.partitions for m in old))
        if partition_for(run_id, settings.partitions) in owned:
            return run_id
    raise AssertionError("no version-2 run hashed to a partition of a version-1 member in 40 tries")


def _statuses(settings: Settings, app: App, run_ids: list[str]) -> dict[str, tuple[RunStatus, str]]:
    with Resumer(settings, app) as r:
        out = {}
        for run_id in run_ids:
            state = r.load(run_id)[0]
            out[run_id] = (state.status, state.workflow.version if state.workflow else "?")
        return out


def _confirmations(root: Path) -> dict[str, list[str]]:
    """The platform's confirmation bodies by order (``order X`` titles)."""
    with sqlite3.connect(root / "world" / "platform.db") as db:
        rows = db.execute("SELECT title, body FROM articles").fetchall()
    out: dict[str, list[str]] = {}
    for title, body in rows:
        out.setdefault(title.removeprefix("order "), []).append(body)
    return out


def test_a_rolling_deploy_under_load_blocks_no_run_and_repeats_no_effect(
        topics: Settings, world: DemoWorld, tmp_path: Path) -> None:
    s = topics.with_(resumer_group=f"t-roll-{uuid.uuid4().hex[:8]}", sweep_interval_ms=1000)
    crashes = _Crashes()
    v1 = lambda: orders_app(world.client, crash=crashes)  # noqa: E731
    v12 = lambda: orders_app(world.client, versions=("1", "2"), crash=crashes)  # noqa: E731
    started: dict[str, tuple[str, str]] = {}
    done: list[ResumeOutcome] = []
    old = [Member(s, v1(), "v1-a", done), Member(s, v1(), "v1-b", done)]
    new: list[Member] = []
    try:
        _start(s, v1(), crashes, [f"a{i}" for i in range(8)], started)  # the old code's runs
        new = [Member(s, v12(), "v12-a", done), Member(s, v12(), "v12-b", done)]
        _start(s, v1(), crashes, [f"b{i}" for i in range(4)], started)  # old writers still start v1
        _start(s, v12(), crashes, [f"c{i}" for i in range(8)], started)  # new writers start v2

        def all_complete() -> bool:
            return all(st is RunStatus.COMPLETED for st, _ in _statuses(s, v12(), list(started)).values())

        # old and new members together
        until(all_complete, "the runs so far completed", [*old, *new], timeout=120, every=0.2)
        _v2_run_for_a_v1_member(s, v12(), crashes, old, started)
        until(lambda: sum(m.service.not_served for m in old) > 0,
              "a version-1 member handed a version-2 run", [*old, *new], timeout=120, every=0.2)
        _start(s, v1(), crashes, [f"e{i}" for i in range(4)], started)  # v1 runs in flight ...
        for m in old:  # ... when the version-1 members leave
            m.leave()
        _start(s, v12(), crashes, [f"d{i}" for i in range(4)], started)  # only the new members now
        run_ids = list(started)
        until(all_complete, "every run completed", new, timeout=180, every=0.2)
    finally:
        for m in [*old, *new]:
            if m.thread.is_alive():
                m.leave()
    assert not any(m.errors for m in [*old, *new]), [m.errors for m in [*old, *new]]

    # each run completed on the version it started on, and nothing was blocked or repeated
    final = _statuses(s, v12(), run_ids)
    assert {run_id: v for run_id, (_, v) in final.items()} == {r: v for r, (_, v) in started.items()}
    assert sorted({v for _, v in started.values()}) == ["1", "2"]
    for run_id in run_ids:
        types = [le.event.type for le in log_of(s, run_id) if le.outcome.accepted]
        assert EventType.RUN_BLOCKED not in types, (run_id, types)
        assert EventType.CALL_DIVERGED not in types, (run_id, types)
        assert types.count(EventType.RUN_COMPLETED) == 1, (run_id, types)
    stats = world.stats()
    orders = len(started)
    assert (stats["charges"], stats["charged_references"]) == (orders, orders), stats
    assert stats["assets"] == orders, stats
    mails = _confirmations(tmp_path)
    assert {o: len(b) for o, b in mails.items()} == {o: 1 for o, _ in started.values()}, mails
    for order, version in started.values():
        assert ("thank you" in mails[order][0]) == (version == "2"), (order, version, mails[order])
    # the version-1 members were handed version-2 runs and left them to the members serving them
    assert sum(m.service.not_served for m in old) > 0, "no request for a version-2 run reached a v1 member"
    print(f"{orders} runs ({sum(v == '2' for _, v in started.values())} on version 2), "
          f"{sum(m.service.not_served for m in old)} parked by version-1 members, {len(done)} outcomes")


def test_a_run_waits_while_no_member_serves_its_version_and_continues_when_one_joins(
        topics: Settings, world: DemoWorld, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    s = topics.with_(resumer_group=f"t-wait-{uuid.uuid4().hex[:8]}", sweep_interval_ms=500)
    crashes = _Crashes()
    started: dict[str, tuple[str, str]] = {}
    _start(s, orders_app(world.client, crash=crashes), crashes, ["w0"], started)  # crashed in pick
    (run_id,) = started
    done: list[ResumeOutcome] = []
    v2_only = Member(s, orders_app(world.client, versions=("2",), crash=crashes), "v2", done)
    v1: Member | None = None
    routes = VersionRoutes(redis_client(s), s.redis_prefix)
    try:
        until(lambda: routes.waiting_for([run_id]) == {run_id: "orders@1"}, "the run parked", [v2_only],
              timeout=60, every=0.2)
        assert routes.live("orders@1") == () and routes.live("orders@2") == (v2_only.service.member,)
        for k, v in s.to_env().items():
            monkeypatch.setenv(k, v)
        capsys.readouterr()
        assert main(["runs"]) == 0
        assert "waits for a member serving orders@1 (none live)" in capsys.readouterr().out
        assert main(["show", run_id]) == 0
        assert "waits for a member serving orders@1 (none live)" in capsys.readouterr().out
        time.sleep(2)  # a version-2 member does not touch it however long it waits
        assert _statuses(s, orders_app(world.client), [run_id])[run_id][0] is RunStatus.RUNNING
        assert [o for o in done if o.run_id == run_id] == []
        v1 = Member(s, orders_app(world.client, crash=crashes), "v1", done)
        until(lambda: any(o.run_id == run_id and o.result == "completed" for o in done),
               "the run completed by the version-1 member", [v2_only, v1], timeout=60, every=0.2)
        # a request the version-2 member read before the run completed may park it again: the run
        # is forgotten all the same (settled with its outcome, or unparked as finished)
        until(lambda: routes.waiting_for([run_id]) == {}, "the completed run no longer parked",
              [v2_only, v1], timeout=10, every=0.2)
        v1.leave()
        # parked late (the version-2 member read a request before the run completed) and no member
        # serving version 1 left to claim it: the version-2 member unparks it as finished
        project(s)  # the projection (a deployment's projector) says the run is complete
        routes.park(run_id, "orders@1")
        until(lambda: routes.waiting_for([run_id]) == {}, "the finished run unparked by a v2 member",
              [v2_only], timeout=10, every=0.2)
    finally:
        for m in (v2_only, v1):
            if m is not None and m.thread.is_alive():
                m.leave()
        routes.client.close()
    assert _statuses(s, orders_app(world.client), [run_id])[run_id] == (RunStatus.COMPLETED, "1")
    assert world.stats()["charges"] == 1
