"""Routing by workflow without services: group names, ``not_mine``, contended retries and their cap."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

import runlog.processors.resume._retries as resumer_mod
from runlog.processors.metrics import ResumerMetrics
from runlog.processors.resume import (
    CONTENDED_RETRIES,
    App,
    ResumeOutcome,
    ResumePlan,
    Resumer,
    ResumerService,
    app_id,
    group_id,
)
from runlog.processors.resume._retries import ContendedRetries
from runlog.producers import DictInputSource, Workflow
from runlog.projections import RunState, RunStatus
from runlog.schemas import Settings, WorkflowSpec
from runlog.schemas._types import StageSpec


def _wf(name: str, version: str = "1") -> Workflow:
    wf = Workflow(name, version)

    @wf.stage("only")
    def only(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return {}

    return wf


def _app(*names: str, name: str | None = None) -> App:
    return App.of([_wf(n) for n in names], [], DictInputSource({}), name=name)


def test_app_id_is_the_name_or_a_stable_hash_of_the_sorted_workflow_names() -> None:
    assert app_id(_app("alpha", name="billing")) == "billing"
    h = app_id(_app("alpha", "beta"))
    assert h.startswith("wf-") and len(h) == 15
    assert app_id(_app("beta", "alpha")) == h  # order of registration does not matter
    assert app_id(_app("alpha")) != h and app_id(_app("beta")) != app_id(_app("alpha"))
    s = Settings.from_env({}, resumer_group="rg")
    assert group_id(s, _app("alpha", name="billing")) == "rg.billing"
    assert group_id(s, _app("alpha", "beta")) == f"rg.{h}"


class _NoRunner:
    def take_over(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("not_mine must not take the lease")


def _resumer(app: App, workflow: WorkflowSpec | None, status: RunStatus = RunStatus.RUNNING) -> Resumer:
    r = Resumer.__new__(Resumer)
    r.app = app
    r.runner = _NoRunner()  # type: ignore[assignment]
    state = RunState("run-1", status=status, workflow=workflow, epoch=3)

    def plan(run_id: str) -> tuple[ResumePlan, RunState]:
        return ResumePlan(run_id, status.value, 0, 1, None,
                          blocked_reason="strict resume refused: whatever"), state

    r.plan = plan  # type: ignore[method-assign]
    return r


def _spec(name: str) -> WorkflowSpec:
    return WorkflowSpec(name, "1", (StageSpec("only", (), (), True),))


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_run_of_an_unregistered_workflow_is_not_mine_and_nothing_is_done(dry_run: bool) -> None:
    out = _resumer(_app("alpha"), _spec("beta")).resume("run-1", dry_run=dry_run)
    assert (out.result, out.epoch) == ("not_mine", 3)
    assert "beta" in out.detail
    done = _resumer(_app("alpha"), _spec("beta"), RunStatus.COMPLETED).resume("run-1")
    assert done.result == "not_mine"


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_registered_name_at_a_version_not_served_waits_and_nothing_is_done(dry_run: bool) -> None:
    # never the strict-resume refusal (a block): no lease taken (the stub refuses), nothing appended
    out = _resumer(_app("alpha"), WorkflowSpec("alpha", "2", ())).resume("run-1", dry_run=dry_run)
    assert (out.result, out.waiting_for, out.epoch) == ("not_served", "alpha@2", 3)


class _FakeRedis:
    def __init__(self) -> None:
        self.pttl_ms = -2
        self.leased = False
        self.removed: list[str] = []

    def pttl(self, key: str) -> int:
        return self.pttl_ms

    def exists(self, key: str) -> int:
        return int(self.leased)


class _FakeActive:
    def __init__(self) -> None:
        self.removed: list[str] = []

    def remove(self, run_id: str) -> None:
        self.removed.append(run_id)


class _FakeRoutes:
    """The version routes: which runs were settled (unparked) with their outcome."""

    def __init__(self) -> None:
        self.settled: list[str] = []

    def settle(self, run_ids: list[str]) -> None:
        self.settled.extend(run_ids)


class _ScriptedResumer:
    def __init__(self, results: list[str]) -> None:
        self.results = results
        self.calls = 0
        self.seen: list[int | None] = []

    def resume(self, run_id: str, *, seen_epoch: int | None = None, request: object = None) -> ResumeOutcome:
        res = self.results[min(self.calls, len(self.results) - 1)]
        self.calls += 1
        self.seen.append(seen_epoch)
        return ResumeOutcome(run_id, res, ResumePlan(run_id, "RUNNING", 0, 0, None))


def _service(results: list[str]) -> tuple[ResumerService, _FakeRedis, _ScriptedResumer, _FakeActive]:
    svc = ResumerService.__new__(ResumerService)
    fake, scripted, active = _FakeRedis(), _ScriptedResumer(results), _FakeActive()
    svc.settings = Settings.from_env({}, lease_ttl_ms=3000, redis_prefix="p")
    svc.redis = fake  # type: ignore[assignment]
    svc.resumer = scripted  # type: ignore[assignment]
    svc.active = active  # type: ignore[assignment]
    svc.routes = _FakeRoutes()  # type: ignore[assignment]
    svc.on_outcome = None
    svc.accept = None
    svc.outcomes = []
    svc.not_mine = 0
    svc.metrics = ResumerMetrics()
    svc.retries = ContendedRetries(fake, svc.lease_key, 3000, resume=svc._retry, metrics=svc.metrics)
    return svc, fake, scripted, active


def test_contended_is_retried_after_the_leases_remaining_lifetime(monkeypatch: pytest.MonkeyPatch) -> None:
    svc, fake, scripted, active = _service(["contended", "completed"])
    fake.pttl_ms = 1800
    assert svc._resume("run-1", None) is not None
    wait = svc.next_retry_in()
    assert wait is not None and 1.8 < wait <= 1.8 + resumer_mod.RETRY_MARGIN_S
    assert svc.run_due_retries() == []  # not due yet
    now = time.monotonic()
    monkeypatch.setattr(time, "monotonic", lambda: now + 2.1)
    assert [o.result for o in svc.run_due_retries()] == ["completed"]
    assert scripted.calls == 2 and svc.next_retry_in() is None
    assert active.removed == ["run-1"] and svc.retries.attempts == {}
    assert svc.routes.settled == ["run-1"]  # type: ignore[attr-defined]  # unparked with its outcome


def test_a_retry_is_asked_of_accept_like_a_request(monkeypatch: pytest.MonkeyPatch) -> None:
    # accept may prepare for the run (a test resumer points the tools at that run's world): a retry
    # made after another run's request was accepted must be accepted again, or refused
    svc, fake, scripted, _ = _service(["contended", "completed"])
    fake.pttl_ms = 0
    asked: list[str] = []
    svc.accept = lambda run_id: asked.append(run_id) or run_id != "run-refused"
    assert svc._resume("run-1", None) is not None and asked == ["run-1"]
    assert svc._resume("run-refused", None) is None and scripted.calls == 1
    now = time.monotonic()
    monkeypatch.setattr(time, "monotonic", lambda: now + 1.0)
    assert [o.result for o in svc.run_due_retries()] == ["completed"]
    assert asked == ["run-1", "run-refused", "run-1"] and scripted.calls == 2


def test_a_retry_keeps_the_epoch_its_request_saw(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resumer_mod, "RETRY_MARGIN_S", 0.0)
    svc, fake, scripted, _ = _service(["contended", "contended", "superseded"])
    fake.pttl_ms = -2
    svc._resume("run-1", None, 7)
    svc._resume("run-1", None, 8)  # a second request while the retry is pending: the later epoch it saw
    assert [o.result for o in svc.run_due_retries()] == ["superseded"]
    assert scripted.seen == [7, 8, 8] and svc.retries.seen == {} and svc.retries.attempts == {}
    svc2, fake2, scripted2, _ = _service(["contended", "contended", "completed"])
    fake2.pttl_ms = -2
    svc2._resume("run-1", None, 7)
    svc2._resume("run-1", None, None)  # one request without an epoch (the sweep): no epoch check
    svc2.run_due_retries()
    assert scripted2.seen == [7, None, None]


def test_contended_retries_are_capped_then_left_to_the_sweep(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(resumer_mod, "RETRY_MARGIN_S", 0.0)
    svc, _, scripted, active = _service(["contended"])
    caplog.set_level(logging.INFO, logger="runlog.resumer")
    svc._resume("run-1", None)
    for _ in range(CONTENDED_RETRIES + 3):
        svc.run_due_retries()
    assert scripted.calls == 1 + CONTENDED_RETRIES
    assert svc.next_retry_in() is None and svc.retries.attempts == {}
    assert active.removed == []  # contended runs stay active: the sweep is the backstop
    gave_up = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(gave_up) == 1 and "giving up" in gave_up[0].getMessage()


def test_a_retry_whose_lease_is_still_held_waits_again_without_resuming(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resumer_mod, "RETRY_MARGIN_S", 0.0)
    svc, fake, scripted, _ = _service(["contended", "completed"])
    svc._resume("run-1", None)
    fake.leased, fake.pttl_ms = True, 0
    svc.run_due_retries()
    assert scripted.calls == 1 and svc.retries.attempts == {"run-1": 2}
    fake.leased, fake.pttl_ms = False, -2
    assert [o.result for o in svc.run_due_retries()] == ["completed"]


def test_not_mine_is_counted_not_reported() -> None:
    svc, _, _, active = _service(["not_mine"])
    seen: list[ResumeOutcome] = []
    svc.on_outcome = seen.append
    out = svc._resume("run-1", None)
    assert out is not None and out.result == "not_mine"
    assert (svc.not_mine, seen, svc.outcomes, active.removed) == (1, [], [], [])


def test_an_unreachable_effects_ledger_fails_the_attempt_and_is_retried_not_raised() -> None:
    """The network fault matrix's resumer partitioned from Redis at ``before:EFFECT_RECONCILED``: the
    ledger's ``LedgerUnavailable`` left the service's loop and ended the resumer process."""
    from runlog.producers.internal import LedgerUnavailable

    svc, _fake, scripted, _active = _service(["completed"])

    def unreachable(run_id: str, *, seen_epoch: int | None = None, request: object = None) -> ResumeOutcome:
        scripted.calls += 1
        raise LedgerUnavailable("effects ledger: reading abc... failed: Connection refused")

    scripted.resume = unreachable  # type: ignore[method-assign]
    assert svc._resume("run-1", None) is None
    assert scripted.calls == 1 and svc.next_retry_in() is not None  # retried later, like a Redis error
