"""A resume is exclusive and final (issue #24, item 3): a second resume of a run that the first one
blocked, or that another resume moved to a later epoch, appends nothing and calls nothing.

Real broker and Redis. The diverged run is :mod:`._diverging`'s: its stage builds a model prompt
from ``random.random()``, so every replay diverges and blocks the run. Before the fix an explicit
``runlog resume`` and the sweep each resumed it: two ``CALL_DIVERGED``, two ``RUN_BLOCKED``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from runlog.processors.demo.run import wait_lease_gone
from runlog.processors.resume import ResumeOutcome, Resumer, ResumerService, request_resume
from runlog.projections import RunStatus
from runlog.schemas import EventType, Settings, partition_for
from tests.integration.resume._diverging import crash_diverging, diverging
from tests.integration.resume._toy import Abandon, crash, toy
from tests.integration.resume.conftest import log_of

pytestmark = pytest.mark.integration


def _group(settings: Settings) -> Settings:
    return settings.with_(resumer_group=f"t-excl-{uuid.uuid4().hex[:8]}", sweep_interval_ms=0)


def _accepted_types(settings: Settings, run_id: str) -> Counter[EventType]:
    return Counter(le.event.type for le in log_of(settings, run_id) if le.outcome.accepted)


def _until(cond: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.05)


def _assert_blocked_once(settings: Settings, run_id: str, model_calls: int) -> None:
    types = _accepted_types(settings, run_id)
    assert types[EventType.CALL_DIVERGED] == 1, types
    assert types[EventType.RUN_BLOCKED] == 1, types
    assert types[EventType.LEASE_ACQUIRED] == 1, types  # only the resume that blocked took a lease
    assert model_calls == 1  # the crashed attempt's; no resume called the model


@contextmanager
def _serving(service: ResumerService) -> Iterator[list[BaseException]]:
    """``service.serve()`` on a thread until the block ends; what it raised, if anything."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            service.serve(stop=stop.is_set)
        except BaseException as err:  # noqa: BLE001 - reported to the test
            errors.append(err)

    t = threading.Thread(target=run, name="resumer", daemon=True)
    t.start()
    try:
        yield errors
    finally:
        stop.set()
        t.join(30)
        assert not t.is_alive(), "the resumer thread did not stop"


def _assigned(service: ResumerService) -> bool:
    return bool(service.partitions)  # kept by its rebalance callbacks (the consumer is the serving thread's)


def test_two_requests_for_a_diverged_run_handled_one_after_the_other_block_it_once(
        topics: Settings) -> None:
    s = _group(topics)
    d = diverging(f"div{uuid.uuid4().hex[:6]}")
    run_id = crash_diverging(s, d)
    wait_lease_gone(s, run_id, 10)
    # what `runlog resume RUN` sends (the epoch it saw), then what the sweep sends (no epoch)
    request_resume(s, run_id, "requested by runlog resume", requested_by="cli", seen_epoch=1)
    request_resume(s, run_id, "lease expired", requested_by="sweeper")
    done: list[ResumeOutcome] = []
    with ResumerService(s, d.app(), on_outcome=done.append) as service:
        _until(lambda: (service.poll_once(0.5), len(done) >= 2)[1], "two outcomes")
    assert [o.result for o in done] == ["blocked", "blocked"], done
    assert "diverged" in done[0].detail and "the run is blocked" in done[1].detail
    assert done[1].epoch == done[0].epoch  # the second took no lease
    _assert_blocked_once(s, run_id, d.calls["model"])


def test_an_explicit_resume_racing_the_resumer_group_blocks_a_diverged_run_once(topics: Settings) -> None:
    s = _group(topics)
    d = diverging(f"div{uuid.uuid4().hex[:6]}")
    run_id = crash_diverging(s, d)
    wait_lease_gone(s, run_id, 10)
    done: list[ResumeOutcome] = []
    with ResumerService(s, d.app(), on_outcome=done.append) as service, _serving(service) as errors:
        _until(lambda: _assigned(service), "the resumer's assignment")
        request_resume(s, run_id, "lease expired", requested_by="sweeper")
        with Resumer(s, d.app()) as r:  # `runlog retry`-like in-process resume, at the same time
            mine = r.resume(run_id, seen_epoch=1)
        # the group's resume ran (a contended one is retried once the lease is gone)
        _until(lambda: any(o.result != "contended" for o in done) and service.next_retry_in() is None,
               "the group's resume of the run")
    assert not errors, errors
    results = [mine.result, *(o.result for o in done)]
    assert set(results) <= {"blocked", "contended", "superseded"} and "blocked" in results, results
    _assert_blocked_once(s, run_id, d.calls["model"])


def test_two_members_of_one_group_handling_requests_for_one_run_block_it_once(topics: Settings) -> None:
    s = _group(topics)
    d = diverging(f"div{uuid.uuid4().hex[:6]}")
    run_id = crash_diverging(s, d)
    wait_lease_gone(s, run_id, 10)
    part = partition_for(run_id, s.partitions)
    done: dict[str, list[ResumeOutcome]] = {"a": [], "b": []}
    members = {name: ResumerService(s, d.app(), on_outcome=done[name].append) for name in ("a", "b")}
    open_ = dict(members)

    def owns(svc: ResumerService) -> bool:
        return part in svc.partitions

    try:
        with _serving(members["a"]) as errors_a, _serving(members["b"]) as errors_b:
            _until(lambda: all(_assigned(m) for m in members.values()), "both members' assignments")
            request_resume(s, run_id, "requested by runlog resume", requested_by="cli", seen_epoch=1)
            request_resume(s, run_id, "lease expired", requested_by="sweeper")
            _until(lambda: len(done["a"]) + len(done["b"]) >= 2, "two outcomes")
        assert not errors_a and not errors_b, (errors_a, errors_b)
        first = next(name for name in ("a", "b") if done[name])
        assert len(done[first]) == 2  # requests keyed by run id: one member handled both
        # the member that owns the run's partition leaves the group; the other takes the partition
        open_.pop(first).close()
        (second, other), = open_.items()
        with _serving(other) as errors:
            _until(lambda: owns(other), "the partition's new owner")
            request_resume(s, run_id, "lease expired", requested_by="sweeper")
            _until(lambda: len(done[second]) >= 1, "the new owner's outcome")
        assert not errors, errors
    finally:
        for m in open_.values():
            m.close()
    assert [o.result for o in done[first] + done[second]] == ["blocked", "blocked", "blocked"], done
    _assert_blocked_once(s, run_id, d.calls["model"])


def test_a_request_that_saw_an_earlier_epoch_is_superseded_and_does_nothing(topics: Settings) -> None:
    s = _group(topics)
    t = toy(f"sup{uuid.uuid4().hex[:6]}")
    run_id = crash(s, t)  # epoch 1
    wait_lease_gone(s, run_id, 10)
    # another resume takes epoch 2 and dies in the run's stage (its lease is released)
    t.crashing = True
    with Resumer(s, t.app()) as r, pytest.raises(Abandon):
        r.resume(run_id)
    t.crashing = False
    before = _accepted_types(s, run_id)
    calls = dict(t.calls)
    request_resume(s, run_id, "requested by runlog resume", requested_by="cli", seen_epoch=1)  # stale
    request_resume(s, run_id, "requested by runlog resume", requested_by="cli", seen_epoch=2)
    done: list[ResumeOutcome] = []
    with ResumerService(s, t.app(), on_outcome=done.append) as service:
        _until(lambda: (service.poll_once(0.5), len(done) >= 1)[1], "the stale request's outcome")
        assert (done[0].result, done[0].epoch) == ("superseded", 2), done
        assert "epoch 2" in done[0].detail
        assert _accepted_types(s, run_id) == before and dict(t.calls) == calls  # nothing appended or called
        _until(lambda: (service.poll_once(0.5), len(done) >= 2)[1], "the current request's outcome")
    assert done[1].result == "completed", done
    with Resumer(s, t.app()) as r:
        assert r.load(run_id)[0].status is RunStatus.COMPLETED
