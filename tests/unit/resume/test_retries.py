"""The contended runs' retry scheduler on its own: when a retry is due, which epoch it carries, its cap."""

from __future__ import annotations

import logging
import time

import pytest
import redis

import runlog.processors.resume._retries as retries_mod
from runlog.processors.metrics import ResumerMetrics
from runlog.processors.resume import CONTENDED_RETRIES, ResumeOutcome, ResumePlan
from runlog.processors.resume._retries import ContendedRetries


class _Leases:
    def __init__(self, pttl_ms: int = -2, held: bool = False) -> None:
        self.pttl_ms, self.held = pttl_ms, held
        self.down = False
        self.asked: list[str] = []

    def pttl(self, name: str) -> int:
        self.asked.append(name)
        if self.down:
            raise redis.ConnectionError("down")
        return self.pttl_ms

    def exists(self, *names: str) -> int:
        if self.down:
            raise redis.ConnectionError("down")
        return int(self.held)


class _Resumes:
    def __init__(self, result: str = "completed") -> None:
        self.result = result
        self.calls: list[tuple[str, int | None]] = []

    def __call__(self, run_id: str, seen_epoch: int | None) -> ResumeOutcome:
        self.calls.append((run_id, seen_epoch))
        return ResumeOutcome(run_id, self.result, ResumePlan(run_id, "RUNNING", 0, 0, None))


def _retries(leases: _Leases, resumes: _Resumes,
             ttl_ms: int = 3000) -> tuple[ContendedRetries, ResumerMetrics]:
    metrics = ResumerMetrics()
    return ContendedRetries(leases, lambda r: f"lease:{r}", ttl_ms, resume=resumes, metrics=metrics), metrics


def _later(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    now = time.monotonic()
    monkeypatch.setattr(time, "monotonic", lambda: now + seconds)


def test_a_retry_is_due_after_the_leases_remaining_lifetime_and_the_margin(
        monkeypatch: pytest.MonkeyPatch) -> None:
    leases, resumes = _Leases(pttl_ms=1200), _Resumes()
    retries, metrics = _retries(leases, resumes)
    retries.schedule("run-1", 4)
    assert leases.asked == ["lease:run-1"] and retries.pending
    wait = retries.next_in()
    assert wait is not None and 1.2 < wait <= 1.2 + retries_mod.RETRY_MARGIN_S
    assert retries.run_due() == [] and resumes.calls == []
    _later(monkeypatch, 1.2 + retries_mod.RETRY_MARGIN_S + 0.01)
    assert [o.result for o in retries.run_due()] == ["completed"]
    assert resumes.calls == [("run-1", 4)] and not retries.pending and retries.next_in() is None
    assert metrics.registry.get_sample_value("runlog_resumer_retries_total") == 1


@pytest.mark.parametrize(("pttl_ms", "down", "wait_s"), [(-1, False, 3.0), (-2, False, 0.0), (0, True, 3.0)])
def test_without_a_known_lifetime_a_retry_waits_a_whole_lease_and_without_a_lease_none(
        pttl_ms: int, down: bool, wait_s: float, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retries_mod, "RETRY_MARGIN_S", 0.0)
    leases = _Leases(pttl_ms=pttl_ms)
    leases.down = down
    retries, _ = _retries(leases, _Resumes(), ttl_ms=3000)
    retries.schedule("run-1", None)
    wait = retries.next_in()
    assert wait is not None and wait == pytest.approx(wait_s, abs=0.05)


def test_the_retry_carries_the_least_strict_epoch_its_requests_saw(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retries_mod, "RETRY_MARGIN_S", 0.0)
    resumes = _Resumes()
    retries, _ = _retries(_Leases(), resumes)
    retries.schedule("run-1", 7)
    retries.schedule("run-1", 9)  # a later request: the later epoch
    retries.schedule("run-1", 8)
    assert dict(retries.seen) == {"run-1": 9} and dict(retries.attempts) == {"run-1": 3}
    retries.schedule("run-2", 7)
    retries.schedule("run-2", None)  # a request without an epoch (the sweep): no check at all
    retries.run_due()
    assert resumes.calls == [("run-1", 9), ("run-2", None)]  # each scheduled once, however often asked


def test_a_run_whose_lease_is_still_held_waits_again_and_that_counts_as_an_attempt(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retries_mod, "RETRY_MARGIN_S", 0.0)
    leases, resumes = _Leases(pttl_ms=0, held=True), _Resumes()
    retries, metrics = _retries(leases, resumes)
    retries.schedule("run-1", 3)
    assert retries.run_due() == [] and resumes.calls == []
    assert dict(retries.attempts) == {"run-1": 2} and retries.pending
    leases.held, leases.down = False, True  # an unreadable lease: resume finds out
    assert [o.run_id for o in retries.run_due()] == ["run-1"] and resumes.calls == [("run-1", 3)]
    assert metrics.registry.get_sample_value("runlog_resumer_retries_total") == 1


def test_a_run_is_given_up_after_the_cap_and_forgotten(caplog: pytest.LogCaptureFixture,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retries_mod, "RETRY_MARGIN_S", 0.0)
    resumes = _Resumes("contended")
    retries, metrics = _retries(_Leases(), resumes)
    caplog.set_level(logging.INFO, logger="runlog.resumer")
    for _ in range(CONTENDED_RETRIES):
        retries.schedule("run-1", 1)
        retries.run_due()
    assert len(resumes.calls) == CONTENDED_RETRIES and dict(retries.attempts) == {"run-1": CONTENDED_RETRIES}
    retries.schedule("run-1", 1)  # one more than the cap
    assert not retries.pending and dict(retries.attempts) == {} and dict(retries.seen) == {}
    assert metrics.registry.get_sample_value("runlog_resumer_retries_abandoned_total") == 1
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and warned[0].endswith("once its lease is gone)")


def test_forget_resets_the_count_a_resolved_run_had() -> None:
    retries, _ = _retries(_Leases(), _Resumes())
    retries.schedule("run-1", 5)
    retries.forget("run-1")
    assert dict(retries.attempts) == {} and dict(retries.seen) == {}
    assert retries.pending  # the retry already scheduled still runs


def test_outcomes_left_to_another_app_are_not_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retries_mod, "RETRY_MARGIN_S", 0.0)
    resumes = _Resumes("not_mine")
    retries, _ = _retries(_Leases(), resumes)
    retries.schedule("run-1", None)
    assert retries.run_due() == [] and resumes.calls == [("run-1", None)]
