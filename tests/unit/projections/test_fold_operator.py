"""The fold of operator events (``EFFECT_RESOLVED``, ``RUN_CANCELLED``) and of failed tool calls."""

from __future__ import annotations

from dataclasses import replace

from runlog.projections import RunState, RunStatus, fold, fold_all
from runlog.projections._state import CallStatus
from runlog.schemas import EffectStatus, ErrorInfo, EventType, ReplayPolicy
from tests.unit.projections.runlogs import RunBuilder, art


def _never_intent(b: RunBuilder, stage: str, n: int) -> tuple[str, str]:
    cid, dk = f"{stage}/charge/{n}", f"dk-{stage}-{n}"
    b.add(EventType.TOOL_CALLED, stage=stage, call_id=cid, tool="charge", replay_policy=ReplayPolicy.NEVER,
          payload_ref=art(f"args-{cid}"), request_hash=f"rh-{cid}")
    b.add(EventType.EFFECT_INTENT, stage=stage, call_id=cid, delivery_key=dk, target="payments:cards",
          tool="charge", replay_policy=ReplayPolicy.NEVER, request_hash=f"rh-{cid}")
    return cid, dk


def _blocked(n_effects: int = 1) -> tuple[RunBuilder, RunState, list[tuple[str, str]]]:
    b = RunBuilder("r").start()
    b.add(EventType.STAGE_STARTED, stage="research")
    effects = [_never_intent(b, "research", i) for i in range(n_effects)]
    b.lease(2)
    b.add(EventType.RUN_BLOCKED, error=ErrorInfo("ResumeBlocked", "a person must check"))
    s = fold_all(b.events)
    assert s is not None and s.status is RunStatus.BLOCKED
    return b, s, effects


def _resolve(b: RunBuilder, s: RunState, cid: str, dk: str, decision: str, ext: str | None) -> RunState:
    b.add(EventType.EFFECT_RESOLVED, stage="research", call_id=cid, tool="charge", delivery_key=dk,
          replay_policy=ReplayPolicy.NEVER, external_id=ext,
          payload_ref=art(f"resolved-{cid}") if decision == "done" else None,
          attributes={"by": "alice", "reason": "checked", "decision": decision})
    out, outcome = fold(s, b.events[-1])
    assert outcome.accepted
    return out


def test_resolved_done_closes_the_effect_done_and_gives_the_call_its_result() -> None:
    b, s, [(cid, dk)] = _blocked()
    b.lease(3)
    s = fold_all(b.events[-1:], s)
    assert s is not None
    s2 = _resolve(b, s, cid, dk, "done", "ch-7")
    assert s2.open_effects == {}
    eff = s2.closed_effects[dk]
    assert (eff.status, eff.external_id, eff.call_id) == (EffectStatus.DONE, "ch-7", cid)
    assert s2.calls[cid].status is CallStatus.RESULT and s2.calls[cid].result == art(f"resolved-{cid}")
    assert s2.status is RunStatus.RUNNING  # nothing else blocks it: a resume continues it


def test_resolved_not_done_closes_the_effect_failed_and_leaves_the_call_without_a_result() -> None:
    b, s, [(cid, dk)] = _blocked()
    b.lease(3)
    s = fold_all(b.events[-1:], s)
    assert s is not None
    s2 = _resolve(b, s, cid, dk, "not_done", None)
    assert s2.open_effects == {} and s2.closed_effects[dk].status is EffectStatus.FAILED
    assert s2.closed_effects[dk].external_id is None
    assert s2.calls[cid].status is CallStatus.FAILED and s2.calls[cid].result is None
    assert s2.status is RunStatus.RUNNING


def test_a_run_with_another_never_effect_open_stays_blocked_after_one_resolution() -> None:
    b, s, [(c0, k0), (c1, k1)] = _blocked(2)
    b.lease(3)
    s = fold_all(b.events[-1:], s)
    assert s is not None
    s = _resolve(b, s, c0, k0, "done", "ch-1")
    assert s.status is RunStatus.BLOCKED and list(s.open_effects) == [k1]
    b.lease(4)
    s = fold_all(b.events[-1:], s)
    assert s is not None
    s = _resolve(b, s, c1, k1, "not_done", None)
    assert s.status is RunStatus.RUNNING and s.open_effects == {}


def test_cancelled_is_terminal_even_after_a_higher_epoch_and_older_epochs_are_fenced() -> None:
    b = RunBuilder("r").start()
    b.add(EventType.STAGE_STARTED, stage="research")
    cid = b.call("research", 0)
    s = fold_all(b.events)
    assert s is not None
    zombie_seq = b.seq + 1
    b.lease(2)
    b.add(EventType.RUN_CANCELLED, error=ErrorInfo("RunCancelled", "cancelled by bob: wrong order"),
          attributes={"by": "bob", "reason": "wrong order"})
    s = fold_all(b.events[-2:], s)
    assert s is not None and s.status is RunStatus.CANCELLED
    assert s.last_error is not None and "bob" in s.last_error.message
    # the old writer's next event (epoch 1) is rejected
    late = replace(b.events[-3], seq=zombie_seq, epoch=1)
    s2, out = fold(s, late)
    assert out.rejected and out.reason == "stale_epoch"
    # a later epoch's lease and events are accepted (they hold their seq) but do not revive the run
    b.lease(3)
    b.add(EventType.STAGE_STARTED, stage="verify")
    s3 = fold_all(b.events[-2:], s2)
    assert s3 is not None and s3.status is RunStatus.CANCELLED and s3.last_seq == b.seq and s3.epoch == 3
    assert s3.stage == "research" and s3.calls[cid].status is CallStatus.RESULT


def test_cancelling_a_completed_run_changes_nothing() -> None:
    b = RunBuilder("r").start().stage("research").complete()
    b.lease(2)
    b.add(EventType.RUN_CANCELLED, attributes={"by": "bob", "reason": "late"})
    s = fold_all(b.events)
    assert s is not None and s.status is RunStatus.COMPLETED


def test_a_failed_tool_call_fails_the_run_with_its_error_and_a_retry_lease_runs_it_again() -> None:
    b = RunBuilder("r").start()
    b.add(EventType.STAGE_STARTED, stage="research")
    b.add(EventType.TOOL_CALLED, stage="research", call_id="research/fetch/0", tool="fetch")
    b.add(EventType.FAILED, stage="research", call_id="research/fetch/0", tool="fetch",
          error=ErrorInfo("RetryableToolError", "503", True))
    s = fold_all(b.events)
    assert s is not None and s.status is RunStatus.FAILED and s.stage == "research"
    assert s.last_error == ErrorInfo("RetryableToolError", "503", True)
    assert s.calls["research/fetch/0"].status is CallStatus.FAILED
    b.lease(2)
    s = fold_all(b.events[-1:], s)
    assert s is not None and s.status is RunStatus.RUNNING
