"""Queues on the real broker and Redis: two workers share a queue's fleet-wide and per-tenant
concurrency (measured inside the tool) and start the runs of three tenants of weights 1:1:2 in
those shares while all three wait; every run completes once. The queues' keys flushed while the
fleet works are rebuilt from the log: nothing lost, nothing started twice. Where a run waits shows
in ``Client.status``, ``runlog show``, ``runlog queues`` and the workers' gauges."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest

from runlog.processors.fleet import SUBMITTED, Client
from runlog.processors.fleet._queues import RedisQueues
from runlog.projections.log_reader import read_topic
from runlog.schemas import Codec, DecodeError, EventType, RunEvent, Settings
from tests.integration.fleet import _app
from tests.integration.fleet._members import _Member

pytestmark = pytest.mark.integration

WEIGHTS = {"a": 1, "b": 1, "c": 2}



def _starts_on_log(settings: Settings) -> Counter[str]:
    """``RUN_STARTED`` events per run on the events topic."""
    codec = Codec.from_settings(settings)
    out: Counter[str] = Counter()
    for batch in read_topic(settings):
        for m in batch:
            try:
                ev = codec.decode(m.value(), RunEvent)
            except DecodeError:
                continue
            if ev.type is EventType.RUN_STARTED:
                out[ev.run_id] += 1
    return out


def _taken(members: list[_Member]) -> set[str]:
    """Runs whose submission a member took from the topic (queued by it, or found queued already)."""
    return {t.run_id for m in members for t in m.taken if t.outcome in ("queued", "duplicate")}


def _submit(client: Client, counts: dict[str, int], hold_s: float) -> dict[str, str]:
    """run id -> tenant, submitted interleaved."""
    runs: dict[str, str] = {}
    for i in range(max(counts.values())):
        for tenant, n in counts.items():
            if i < n:
                r = client.submit("fair", {"tenant": tenant, "hold_s": hold_s, "i": i}, queue="fair",
                                  tenant=tenant)
                runs[r.run_id] = tenant
    return runs


def test_three_tenants_share_two_workers_by_weight_within_the_queues_limits(
        fleet_settings: Settings, members: list[_Member]) -> None:
    _app.GAUGE.reset()
    counts = {"a": 20, "b": 20, "c": 40}
    with Client(fleet_settings, name="web") as web:
        runs = _submit(web, counts, hold_s=0.25)
        members.append(_Member(fleet_settings, _app.app_fair, concurrency=3))
        members.append(_Member(fleet_settings, _app.app_fair, concurrency=3))
        for run_id in runs:
            assert web.run(run_id).result(timeout=120).completed
    assert not [m.errors for m in members if m.errors]
    started = sorted((t for m in members for t in m.taken if t.outcome == "started"), key=lambda t: t.at)
    assert Counter(t.run_id for t in started) == Counter(dict.fromkeys(runs, 1))  # each started once
    assert all(len([t for t in m.taken if t.outcome == "started"]) > 5 for m in members)  # both worked
    # while all three tenants wait: up to the first start of any tenant's last run
    last = {tenant: max(i for i, t in enumerate(started) if t.tenant == tenant) for tenant in WEIGHTS}
    window = started[:min(last.values()) + 1]
    got = Counter(t.tenant for t in window)
    for tenant, w in WEIGHTS.items():
        want = w / sum(WEIGHTS.values())
        assert abs(got[tenant] / len(window) - want) <= 0.1 * want, (got, len(window))
    assert len(window) >= 40
    # measured inside the tool, across both workers
    assert _app.GAUGE.most_total == _app.FAIR.concurrency
    assert max(_app.GAUGE.most.values()) == _app.FAIR.per_tenant
    assert _starts_on_log(fleet_settings) == Counter(dict.fromkeys(runs, 1))


def test_the_queues_flushed_while_the_fleet_works_are_rebuilt_from_the_log(
        fleet_settings: Settings, members: list[_Member]) -> None:
    with Client(fleet_settings, name="web") as web:
        runs = _submit(web, {"a": 10, "b": 10, "c": 10}, hold_s=0.3)
        members.append(_Member(fleet_settings, _app.app_fair, concurrency=2))
        members.append(_Member(fleet_settings, _app.app_fair, concurrency=2))
        deadline = time.monotonic() + 60
        # every submission taken from the topic (so only the rebuild can queue one again) and 8 started
        while (sum(t.outcome == "started" for m in members for t in m.taken) < 8
               or not set(runs) <= _taken(members)):
            assert time.monotonic() < deadline, [m.taken for m in members]
            time.sleep(0.05)
        flushed = RedisQueues(web.redis, fleet_settings.redis_prefix, members[0].worker.service.group)
        assert flushed.flush("fair") > 5  # what a lost Redis looks like, mid-flight
        for run_id in runs:
            assert web.run(run_id).result(timeout=120).completed
    assert not [m.errors for m in members if m.errors]
    rebuilds = [r for m in members for r in m.worker.intake.rebuilds]
    # the first member at its start (the second found the keys), one at least after the flush
    assert rebuilds and rebuilds[0].started == 0, rebuilds
    assert any(r.started >= 8 and 0 < sum(r.queued.values()) <= 30 - 8 for r in rebuilds[1:]), rebuilds
    started = Counter(t.run_id for m in members for t in m.taken if t.outcome == "started")
    assert started == Counter(dict.fromkeys(runs, 1))
    assert _starts_on_log(fleet_settings) == Counter(dict.fromkeys(runs, 1))


def test_a_member_declaring_the_lost_queues_again_does_not_hide_the_loss_from_the_others(
        fleet_settings: Settings, members: list[_Member]) -> None:
    """A member that rebuilt the queues at its start may not rebuild again for ``REBUILD_GAP_S``, but
    it declares their limits on every look; if that made the queues look kept, no member would rebuild
    them and the runs pending when Redis lost them would never start."""
    with Client(fleet_settings, name="web") as web:
        runs = _submit(web, {"a": 3, "b": 3}, hold_s=0.5)
        first = _Member(fleet_settings, _app.app_fair, concurrency=1)
        members.append(first)
        deadline = time.monotonic() + 60
        # every submission taken from the topic (and committed): the queues alone hold what waits
        while not (any(t.outcome == "started" for t in first.taken) and set(runs) <= _taken([first])):
            assert time.monotonic() < deadline, first.taken
            time.sleep(0.05)
        queues = RedisQueues(web.redis, fleet_settings.redis_prefix, first.worker.service.group)
        assert queues.flush("fair") > 0
        queues.declare(_app.FAIR)  # what the first member does on its next look, within its gap
        assert queues.declared("fair") and not queues.built("fair")
        second = _Member(fleet_settings, _app.app_fair, concurrency=1)
        members.append(second)
        for run_id in runs:
            assert web.run(run_id).result(timeout=60).completed
    assert not [m.errors for m in members if m.errors]
    assert [r for r in second.worker.intake.rebuilds if sum(r.queued.values()) > 0], \
        second.worker.intake.rebuilds
    started = Counter(t.run_id for m in members for t in m.taken if t.outcome == "started")
    assert started == Counter(dict.fromkeys(runs, 1))
    assert _starts_on_log(fleet_settings) == Counter(dict.fromkeys(runs, 1))


def test_a_waiting_run_says_where_and_why(fleet_settings: Settings, members: list[_Member],
                                          monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from runlog.processors.cli import main

    for k, v in fleet_settings.to_env().items():
        monkeypatch.setenv(k, v)
    _app.GAUGE.reset()
    with Client(fleet_settings, name="web") as web:
        runs = list(_submit(web, {"a": 4, "c": 1}, hold_s=3.0))
        member = _Member(fleet_settings, _app.app_fair, concurrency=4)
        members.append(member)
        deadline = time.monotonic() + 60
        while sum(t.outcome == "started" for t in member.taken) < 3:  # a: 2 (its cap), c: 1
            assert time.monotonic() < deadline, member.taken
            time.sleep(0.05)
        waiting = [r for r in runs if web.status(r).status == SUBMITTED]
        assert len(waiting) == 2
        info = web.status(waiting[0])
        assert info.queued is not None and (info.queued.queue, info.queued.tenant, info.queued.reason) == (
            "fair", "a", "tenant")
        capsys.readouterr()
        assert main(["queues", "--json"]) == 0
        docs = {d["queue"]: d for d in json.loads(capsys.readouterr().out)}
        assert sorted(docs) == ["default", "fair"]  # the App's and the default one, declared by its worker
        doc = docs["fair"]
        assert (doc["queue"], doc["concurrency"], doc["per_tenant"], doc["pending"], doc["running"]) == (
            "fair", 4, 2, 2, 3)
        tenants = {t["tenant"]: t for t in doc["tenants"]}
        assert (tenants["a"]["pending"], tenants["a"]["running"], tenants["c"]["weight"]) == (2, 2, 2.0)
        assert main(["queues"]) == 0
        assert "fair" in capsys.readouterr().out
        assert main(["show", waiting[0]]) == 0
        out = capsys.readouterr().out
        assert "waiting in queue fair" in out and "tenant a's concurrency is taken" in out, out
        assert main(["runs", "--json"]) == 0
        listed = {d["run_id"]: d for d in json.loads(capsys.readouterr().out)}
        assert (listed[waiting[0]]["status"], listed[waiting[0]]["queued"]["reason"]) == (SUBMITTED, "tenant")
        metrics = member.worker.service.metrics.registry
        deadline = time.monotonic() + 10  # the gauges are refreshed with the queues' upkeep (every 2 s)
        while (metrics.get_sample_value("runlog_queue_running", {"queue": "fair", "tenant": "a"}),
               metrics.get_sample_value("runlog_queue_pending", {"queue": "fair", "tenant": "a"})) != (2, 2):
            assert time.monotonic() < deadline, "the gauges never showed tenant a's 2 running, 2 pending"
            time.sleep(0.1)
        for r in runs:
            assert web.run(r).result(timeout=60).completed
