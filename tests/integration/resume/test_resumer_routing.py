"""Resumers route by workflow: one group per App, contended requests retried, no projector needed."""

from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest
import redis
from confluent_kafka import Producer

from runlog.processors.demo.run import wait_lease_gone
from runlog.processors.resume import ResumeOutcome, ResumerService, request_resume
from runlog.producers.run._active import ActiveRuns
from runlog.projections import RunStatus
from runlog.schemas import EventType, Settings, Topics
from tests.integration.resume._toy import Toy, crash, toy, wait_events_topic_ready
from tests.integration.resume.conftest import log_of, project, types_of
from tests.integration.resume.test_resumer_service import _dead_letters

pytestmark = pytest.mark.integration


def _settings(topics: Settings) -> Settings:
    return topics.with_(resumer_group=f"t-resumer-{uuid.uuid4().hex[:8]}", sweep_interval_ms=0)


def _crashed(s: Settings, t: Toy, n: int) -> list[str]:
    ids = [crash(s, t, q=f"q{i}") for i in range(n)]
    for run_id in ids:
        wait_lease_gone(s, run_id, s.lease_ttl_ms / 1000 * 4)
    return ids


def _joined(service: ResumerService, timeout: float = 30) -> None:
    """Poll until the consumer has its partitions (nothing is on the topic yet)."""
    deadline = time.monotonic() + timeout
    while not service.consumer.assignment():
        assert time.monotonic() < deadline, "the resumer never got partitions"
        assert service.poll_once(0.2) is None


def _drive(service: ResumerService, want: int, timeout: float = 60) -> list[ResumeOutcome]:
    deadline = time.monotonic() + timeout
    while len(service.outcomes) < want and time.monotonic() < deadline:
        service.poll_once(0.5)
    assert len(service.outcomes) >= want, [(o.run_id, o.result) for o in service.outcomes]
    return service.outcomes


def test_two_apps_on_one_cluster_each_resume_only_their_own_runs(topics: Settings) -> None:
    s = _settings(topics)
    alpha, beta = toy("alpha"), toy("beta")
    a_runs, b_runs = _crashed(s, alpha, 2), _crashed(s, beta, 2)
    assert alpha.calls == {"lookup": 2, "render": 2} and beta.calls == alpha.calls
    for run_id in [*a_runs, *b_runs]:
        request_resume(s, run_id, "test", requested_by="test")

    with ResumerService(s, alpha.app()) as sa, ResumerService(s, beta.app(name="beta-app")) as sb:
        # group ids carry the topic prefix (Settings.group_id)
        assert sa.group.startswith(s.group_id(f"{s.resumer_group}.wf-"))
        assert sb.group == f"{s.topic_prefix}{s.resumer_group}.beta-app"
        deadline = time.monotonic() + 120

        def until_all_seen(svc: ResumerService) -> bool:
            return (len(svc.outcomes) >= 2 and svc.not_mine >= 2) or time.monotonic() > deadline

        threads = [threading.Thread(target=svc.serve, kwargs={"stop": lambda svc=svc: until_all_seen(svc)})
                   for svc in (sa, sb)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(150)
        got_a = {o.run_id: o.result for o in sa.outcomes}
        got_b = {o.run_id: o.result for o in sb.outcomes}

    # each group continued exactly its own runs and answered the others' requests not_mine
    assert got_a == dict.fromkeys(a_runs, "completed"), got_a
    assert got_b == dict.fromkeys(b_runs, "completed"), got_b
    assert (sa.not_mine, sb.not_mine) == (2, 2)
    for run_id in [*a_runs, *b_runs]:
        types = types_of(log_of(s, run_id))
        assert EventType.RUN_BLOCKED not in types
        assert types.count(EventType.LEASE_ACQUIRED) == 1  # one resume, by the owning App only
        assert types[-1] is EventType.RUN_COMPLETED
    # recorded results reused: gather verified before the crash, render's result recorded
    assert alpha.calls == {"lookup": 2, "render": 2} and beta.calls == alpha.calls


def test_contended_request_is_retried_after_the_lease_expires_without_a_sweep(topics: Settings) -> None:
    s = _settings(topics)
    alpha = toy("alpha")
    r = redis.Redis.from_url(s.redis_url)
    with ResumerService(s, alpha.app()) as service:
        _joined(service)
        # a crashed worker whose lease still lives a few seconds
        run_id = crash(s.with_(lease_ttl_ms=6000), alpha)
        left_ms = int(r.pttl(f"{s.redis_prefix}:{{{run_id}}}:lease"))
        assert left_ms > 2000, left_ms
        t0 = time.monotonic()
        request_resume(s, run_id, "test", requested_by="test")
        deadline = t0 + 60
        service.serve(stop=lambda: any(o.result == "completed" for o in service.outcomes)
                      or time.monotonic() > deadline)
        elapsed = time.monotonic() - t0
        results = [o.result for o in service.outcomes]
    r.close()
    assert results == ["contended", "completed"], [(o.result, o.detail) for o in service.outcomes]
    assert elapsed >= (left_ms - 1000) / 1000, elapsed  # waited for the lease, not a blind retry
    types = types_of(log_of(s, run_id))
    assert types[-1] is EventType.RUN_COMPLETED and types.count(EventType.LEASE_ACQUIRED) == 1


def test_requests_and_the_sweep_need_no_projector(topics: Settings, redis_client: redis.Redis) -> None:
    s = _settings(topics)
    alpha, beta = toy("alpha"), toy("beta")
    active = ActiveRuns(redis_client, s.redis_prefix)
    r1, r2 = _crashed(s, alpha, 2)
    (r3,) = _crashed(s, beta, 1)
    with ResumerService(s, alpha.app()) as service:
        assert service.projection.runs() == []  # no projector ever ran
        # a request resolves from the log alone
        request_resume(s, r1, "test", requested_by="test")
        assert [(o.run_id, o.result) for o in _drive(service, 1)] == [(r1, "completed")]
        assert service.projection.load_state(r1) is None

        # the sweep: the writer-side active set, only this App's workflows, only dead leases
        active.add(r1, "alpha", at_ms=1)  # stale: the run completed above
        active.add(r2, "alpha", at_ms=2)
        active.add(r3, "beta", at_ms=3)
        report = service.sweep()
        assert report.requested == [r1, r2] and report.alive == 0
        got = {o.run_id: o.result for o in _drive(service, 3)[1:]}
        assert got == {r1: "nothing_to_do", r2: "completed"}
        assert active.list() == [(r3, "beta")]  # finished runs left the set, the foreign one stays

        # runs only the projection shows RUNNING are swept too, by their own App only
        active.remove(r3)
        project(s)
        assert service.projection.runs(RunStatus.RUNNING) == [r3]
        assert service.sweep().requested == []
    with ResumerService(s, beta.app()) as other:
        assert other.sweep().requested == [r3]
        assert [(o.run_id, o.result) for o in _drive(other, 1)] == [(r3, "completed")]
    assert alpha.calls["lookup"] == 2 and beta.calls["lookup"] == 1


def test_dead_lettered_requests_are_logged_with_their_reason(
        topics: Settings, caplog: pytest.LogCaptureFixture) -> None:
    s = _settings(topics)
    wait_events_topic_ready(s)
    p = Producer(s.producer_config())
    p.produce(Topics.of(s).resume, key=b"run-junk", value=b"\x00not a resume request")
    assert p.flush(30) == 0
    request_resume(s, "run-nobody-knows", "test", requested_by="test")
    caplog.set_level(logging.WARNING, logger="runlog.resumer")
    with ResumerService(s, toy("alpha").app()) as service:
        deadline = time.monotonic() + 30
        letters = _dead_letters(s, 2, timeout=1)
        while len(letters) < 2 and time.monotonic() < deadline:
            service.poll_once(0.5)
            letters = _dead_letters(s, 2, timeout=1)
    by_key = {k: h["runlog.error.reason"].decode() for k, h in letters}
    assert by_key[b"run-nobody-knows"] == "unknown_run"
    warnings = [rec.getMessage() for rec in caplog.records
                if rec.name == "runlog.resumer" and rec.levelno == logging.WARNING]
    assert any("run-nobody-knows" in m and "unknown_run" in m for m in warnings), warnings
    assert any("run-junk" in m and by_key[b"run-junk"] in m for m in warnings), warnings


def test_one_member_of_a_group_sweeps_per_interval(topics: Settings) -> None:
    """The serving loop's sweep (``sweep_if_turn``): two members of one group, one dead run; the
    first member to take the turn requests it, the other does not sweep that interval (it asked a
    second resume of every dead run), and once the interval passed a member sweeps again."""
    s = _settings(topics).with_(sweep_interval_ms=1_500)
    alpha = toy("alpha")
    (r1,) = _crashed(s, alpha, 1)
    ActiveRuns(redis.Redis.from_url(s.redis_url), s.redis_prefix).add(r1, "alpha", at_ms=1)
    with ResumerService(s, alpha.app()) as one, ResumerService(s, alpha.app()) as two:
        assert one.group == two.group and one.member != two.member
        first = one.sweep_if_turn()
        assert first is not None and first.requested == [r1]
        assert two.sweep_if_turn() is None and one.sweep_if_turn() is None  # the turn is taken
        time.sleep(1.6)
        again = two.sweep_if_turn()
        assert again is not None and again.requested == [r1]  # still dead: asked again, once
