"""Every decision of the resume plan, from facts alone (``runlog.processors.resume.plan``: no services).

One test (or parametrized case) per outcome the plan and the outcome functions can produce."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from runlog.processors.resume.plan import (
    NO_WORKFLOW,
    CheckpointCheck,
    PlanFacts,
    ResumePlan,
    decide_plan,
    outcome_after_lease,
    outcome_before_lease,
)
from runlog.producers import App, DictInputSource, Tool, Workflow, tool
from runlog.producers.calls._ledger import LedgerEntry
from runlog.projections import CallRecord, CallStatus, EffectEntry, RunState, RunStatus
from runlog.projections._state import WaitInfo
from runlog.schemas import ArtifactRef, Checkpoint, EffectStatus, ErrorInfo, ReplayPolicy, WorkflowSpec

RUN = "run-1"


def _workflow(version: str = "1", *, third: bool = False) -> Workflow:
    wf = Workflow("article", version)

    @wf.stage("draft")
    def draft(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return {}

    @wf.stage("publish")
    def publish(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return {}

    if third:
        @wf.stage("announce")
        def announce(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
            return {}

    return wf


def _tool(name: str, policy: ReplayPolicy) -> Tool:
    @tool(name, policy=policy, target="cms:articles", effect=True,
          delivery=lambda args, call: ("a", "cms", "o", "1"), reconcile=lambda dk, args: None)
    def fn(call: Any) -> Any:
        return {"external_id": "x"}

    return fn


def _app(*workflows: Workflow, tools: tuple[Tool, ...] = ()) -> App:
    return App.of(list(workflows) or [_workflow()], list(tools), DictInputSource({}))


SPEC: WorkflowSpec = _workflow().spec()


def _ref(c: str) -> ArtifactRef:
    return ArtifactRef(f"mem://{c}", c * 64, 1)


def _cp(seq: int, stage: str, next_stage: str | None) -> Checkpoint:
    return Checkpoint(f"{RUN}:{seq}", RUN, seq, 0, seq * 2, stage, 1, artifacts=(_ref("a"),),
                      next_stage=next_stage)


def _state(status: RunStatus = RunStatus.RUNNING, workflow: WorkflowSpec | None = SPEC,
           **kw: Any) -> RunState:
    base: dict[str, Any] = {"partition": 0, "offset": 40, "epoch": 2, "last_seq": 20}
    return RunState(RUN, status=status, workflow=workflow, **{**base, **kw})


DRAFT_DONE = _state(completed_stages=("draft",), stage_outputs={"draft": _ref("d")})


def _check(seq: int = 9, problem: str | None = None, checked: int = 1,
           state: RunState = DRAFT_DONE) -> CheckpointCheck:
    return CheckpointCheck(_cp(seq, "draft", "publish"), state, checked, problem)


def _call(call_id: str, stage: str, status: CallStatus = CallStatus.RESULT,
          result: ArtifactRef | None = None) -> CallRecord:
    return CallRecord(call_id, "search", ReplayPolicy.SAFE, status, stage, 3,
                      result=result if result is not None or status is not CallStatus.RESULT else _ref("r"),
                      request_hash=f"h-{call_id}")


def _effect(call_id: str, policy: ReplayPolicy | None, status: EffectStatus = EffectStatus.INTENT,
            external_id: str | None = None, key: str | None = None) -> EffectEntry:
    return EffectEntry(key or f"dk-{call_id}", RUN, "cms:articles", status, 5, 1, call_id=call_id,
                       tool="post", stage="publish", external_id=external_id, replay_policy=policy)


def _plan(state: RunState, app: App | None = None, **facts: Any) -> ResumePlan:
    return decide_plan(PlanFacts(state, 4, **facts), app or _app())


# -- 1. settled runs, and runs without a workflow ----------------------------------------------


@pytest.mark.parametrize("status", [RunStatus.COMPLETED, RunStatus.CANCELLED])
def test_a_settled_run_is_planned_no_further(status: RunStatus) -> None:
    plan = _plan(_state(status), checks=(_check(),), checkpoints_known=1)
    assert (plan.status, plan.events_read, plan.partition) == (status.value, 4, 0)
    assert plan.checkpoint is None and plan.from_stage is None and plan.blocked_reason is None
    assert plan.artifacts_checked == 0 and plan.recorded == {} and plan.effects == []


def test_a_run_without_a_workflow_is_blocked() -> None:
    plan = _plan(_state(workflow=None))
    assert plan.blocked_reason == NO_WORKFLOW and plan.from_stage is None


def test_a_settled_run_without_a_workflow_is_not_blocked() -> None:
    assert _plan(_state(RunStatus.COMPLETED, workflow=None)).blocked_reason is None


# -- 2. the checkpoint ------------------------------------------------------------------------


def test_without_checkpoints_the_run_starts_from_its_first_stage() -> None:
    plan = _plan(_state())
    assert (plan.checkpoint, plan.from_stage, plan.blocked_reason) == (None, "draft", None)
    assert plan.stage_outputs == {} and plan.artifacts_checked == 0


def test_the_newest_intact_checkpoint_is_chosen() -> None:
    plan = _plan(_state(), checks=(_check(checked=3),), checkpoints_known=1)
    assert plan.checkpoint == _cp(9, "draft", "publish")
    assert plan.from_stage == "publish" and plan.stage_outputs == {"draft": _ref("d")}
    assert plan.artifacts_checked == 3 and plan.checkpoints_rejected == []
    assert plan.blocked_reason is None


def test_a_rejected_checkpoint_falls_back_to_an_earlier_intact_one() -> None:
    older = _state(completed_stages=("draft",), stage_outputs={"draft": _ref("d")})
    checks = (CheckpointCheck(_cp(15, "publish", None), _state(), 2, "ArtifactMissing: gone"),
              _check(9, None, 1, older))
    plan = _plan(_state(), checks=checks, checkpoints_known=2)
    assert plan.checkpoint is not None and plan.checkpoint.checkpoint_id == f"{RUN}:9"
    assert plan.checkpoints_rejected == [(f"{RUN}:15", "ArtifactMissing: gone")]
    assert plan.artifacts_checked == 3 and plan.from_stage == "publish" and plan.blocked_reason is None


def test_no_intact_checkpoint_blocks_the_run_with_every_problem() -> None:
    checks = (_check(15, "ArtifactMissing: a"), _check(9, "ArtifactCorrupt: b"))
    plan = _plan(_state(), checks=checks, checkpoints_known=2)
    assert plan.blocked_reason == (f"no checkpoint has intact artifacts: {RUN}:15: ArtifactMissing: a; "
                                   f"{RUN}:9: ArtifactCorrupt: b")
    assert plan.checkpoint is None and plan.from_stage is None and plan.artifacts_checked == 2


def test_a_rejected_checkpoint_with_no_history_left_to_read_starts_from_the_first_stage() -> None:
    # the latest checkpoint failed and its history could not be read back (no checkpoint known)
    plan = _plan(_state(), checks=(_check(9, "ArtifactMissing: a"),), checkpoints_known=0)
    assert plan.blocked_reason is None and plan.checkpoint is None and plan.from_stage == "draft"
    assert plan.checkpoints_rejected == [(f"{RUN}:9", "ArtifactMissing: a")]


# -- 3. strict resume -------------------------------------------------------------------------


def test_a_version_the_app_does_not_register_is_refused() -> None:
    plan = _plan(_state(), _app(_workflow("2")), checks=(_check(),), checkpoints_known=1)
    assert plan.blocked_reason is not None and plan.blocked_reason.startswith("strict resume refused: ")
    assert plan.checkpoint is not None and plan.from_stage == "publish"  # what it found is kept


def test_a_different_definition_at_the_same_version_is_refused() -> None:
    plan = _plan(_state(), _app(_workflow(third=True)))
    assert plan.blocked_reason == ("strict resume refused: workflow 'article' version '1' is registered "
                                   "with a different definition than the run recorded")


# -- 4. recorded calls ------------------------------------------------------------------------


def test_recorded_calls_of_stages_to_run_again_are_guarded_and_intact_results_reused() -> None:
    calls = {"draft/search/0": _call("draft/search/0", "draft"),
             "publish/search/0": _call("publish/search/0", "publish"),
             "publish/search/1": _call("publish/search/1", "publish", CallStatus.CALLED)}
    plan = _plan(_state(calls=calls), checks=(_check(),), checkpoints_known=1)
    assert sorted(plan.recorded) == ["publish/search/0", "publish/search/1"]  # draft is done
    assert plan.reused_calls == {"publish/search/0": _ref("r")}
    assert plan.recorded["publish/search/0"].result == _ref("r")
    assert plan.recorded["publish/search/1"].result is None
    assert plan.recorded["publish/search/0"].request_hash == "h-publish/search/0"


def test_a_corrupt_recorded_result_is_not_reused_and_the_call_runs_again() -> None:
    calls = {"publish/search/0": _call("publish/search/0", "publish")}
    plan = _plan(_state(calls=calls), result_problems={"publish/search/0": "ArtifactCorrupt: x"})
    assert plan.reused_calls == {} and plan.unusable_results == [("publish/search/0", "ArtifactCorrupt: x")]
    assert plan.recorded["publish/search/0"].result is None and plan.blocked_reason is None


def test_after_a_fall_back_the_results_recorded_since_the_chosen_checkpoint_are_reused() -> None:
    checks = (CheckpointCheck(_cp(15, "publish", None), _state(), 1, "ArtifactMissing: gone"), _check(9))
    after = {"publish/search/0": _call("publish/search/0", "publish")}
    plan = _plan(_state(), checks=checks, checkpoints_known=2, calls_after=after, calls_after_read=6)
    assert plan.reused_calls == {"publish/search/0": _ref("r")} and plan.events_read == 4 + 6


def test_results_read_after_a_checkpoint_count_only_after_a_fall_back() -> None:
    after = {"publish/search/0": _call("publish/search/0", "publish")}
    plan = _plan(_state(), checks=(_check(),), checkpoints_known=1, calls_after=after, calls_after_read=6)
    assert plan.reused_calls == {} and plan.events_read == 4


# -- 5. effects -------------------------------------------------------------------------------


@pytest.mark.parametrize(("policy", "action"), [
    (ReplayPolicy.SAFE, "rerun"),
    (ReplayPolicy.IDEMPOTENT, "rerun_same_key"),
    (ReplayPolicy.RECONCILE_FIRST, "reconcile"),
])
def test_an_open_effect_is_planned_by_its_policy(policy: ReplayPolicy, action: str) -> None:
    state = _state(open_effects={"dk": _effect("publish/post/0", policy, key="dk")})
    plan = _plan(state, _app(tools=(_tool("post", policy),)))
    assert [e.action for e in plan.effects] == [action] and plan.blocked_reason is None


def test_an_open_effect_whose_result_is_recorded_is_reused() -> None:
    state = _state(calls={"publish/post/0": _call("publish/post/0", "publish")},
                   open_effects={"dk": _effect("publish/post/0", ReplayPolicy.NEVER, key="dk")})
    assert [e.action for e in _plan(state).effects] == ["reuse"]


@pytest.mark.parametrize("policy", [ReplayPolicy.NEVER, None])
def test_an_open_never_effect_blocks_the_run_for_a_person(policy: ReplayPolicy | None) -> None:
    state = _state(open_effects={"dk": _effect("publish/post/0", policy, key="dk")})
    plan = _plan(state)
    assert [e.action for e in plan.effects] == ["block"]
    assert plan.blocked_reason is not None and "a person must check" in plan.blocked_reason


def test_an_unregistered_reconcile_first_tool_blocks_the_run() -> None:
    state = _state(open_effects={"dk": _effect("publish/post/0", ReplayPolicy.RECONCILE_FIRST, key="dk")})
    plan = _plan(state)
    assert plan.blocked_reason == "tool 'post' is not registered, so it cannot be reconciled"


def test_every_blocking_effect_is_in_the_reason() -> None:
    state = _state(open_effects={"a": _effect("publish/post/0", ReplayPolicy.NEVER, key="a"),
                                 "b": _effect("publish/post/1", ReplayPolicy.RECONCILE_FIRST, key="b")})
    reason = _plan(state).blocked_reason
    assert reason is not None and reason.count("; ") >= 1 and "not registered" in reason


def _done(key: str, status: EffectStatus = EffectStatus.DONE,
          external_id: str | None = "ext-9") -> LedgerEntry:
    return LedgerEntry(key, "run-0", "publish/post/0", status, external_id)


def test_a_never_effect_the_ledger_records_done_is_reused_with_its_external_id() -> None:
    state = _state(open_effects={"dk": _effect("publish/post/0", ReplayPolicy.NEVER, key="dk")})
    plan = _plan(state, ledger={"dk": _done("dk")})
    (e,) = plan.effects
    assert (e.action, e.external_id, plan.blocked_reason) == ("reuse_ledger", "ext-9", None)
    assert "run-0" in e.detail and "claim" in e.detail


@pytest.mark.parametrize(("policy", "entry", "action"), [
    (ReplayPolicy.NEVER, _done("dk", EffectStatus.INTENT), "block"),  # the ledger has no result
    (ReplayPolicy.NEVER, _done("dk", external_id=None), "block"),  # done without an id is not done
    (ReplayPolicy.SAFE, _done("dk"), "rerun"),  # the other policies ask again or call again
])
def test_the_ledger_is_used_only_for_a_done_never_effect(policy: ReplayPolicy, entry: LedgerEntry,
                                                         action: str) -> None:
    state = _state(open_effects={"dk": _effect("publish/post/0", policy, key="dk")})
    assert [e.action for e in _plan(state, ledger={"dk": entry}).effects] == [action]


def test_a_closed_effect_of_a_stage_run_again_is_reused_by_its_external_id() -> None:
    call = _call("publish/post/0", "publish", CallStatus.CALLED)
    state = _state(calls={call.call_id: call},
                   closed_effects={"dk": _effect(call.call_id, ReplayPolicy.NEVER, EffectStatus.DONE, "ext-1",
                                                 key="dk")})
    (e,) = _plan(state).effects
    assert (e.action, e.detail) == ("reuse_external", "external id ext-1 already recorded")


@pytest.mark.parametrize("case", ["failed", "no_external_id", "no_call", "result_reused", "stage_done"])
def test_closed_effects_that_need_nothing_are_left_out(case: str) -> None:
    status = EffectStatus.FAILED if case == "failed" else EffectStatus.DONE
    stage = "draft" if case == "stage_done" else "publish"
    call_status = CallStatus.RESULT if case == "result_reused" else CallStatus.CALLED
    calls = {} if case == "no_call" else {"c": replace(_call("c", stage, call_status), call_id="c")}
    eff = _effect("c", ReplayPolicy.NEVER, status, None if case == "no_external_id" else "ext-1", key="dk")
    state = _state(calls=calls, closed_effects={"dk": eff})
    assert _plan(state, checks=(_check(),), checkpoints_known=1).effects == []


def test_the_same_facts_give_the_same_plan() -> None:
    state = _state(calls={"publish/search/0": _call("publish/search/0", "publish")},
                   open_effects={"dk": _effect("publish/post/0", ReplayPolicy.SAFE, key="dk")})
    facts = PlanFacts(state, 4, (_check(),), 1)
    assert decide_plan(facts, _app()).to_dict() == decide_plan(facts, _app()).to_dict()


# -- outcomes before the lease ---------------------------------------------------------------


def _before(state: RunState, *, dry_run: bool = False, retry: bool = False, now: int = 1_000,
            app: App | None = None, seen_epoch: int | None = None) -> tuple[str, str, bool] | None:
    e = outcome_before_lease(state, app or _app(), dry_run=dry_run, retry=retry, now=now,
                             seen_epoch=seen_epoch)
    return None if e is None else (e.result, e.detail, e.deactivate)


def test_a_run_of_a_workflow_the_app_does_not_register_is_not_mine() -> None:
    other = WorkflowSpec("other", "1", ())
    assert _before(_state(workflow=other)) == (
        "not_mine", "workflow 'other' is not registered by this App", False)
    assert _before(_state(RunStatus.COMPLETED, workflow=other)) is not None  # whatever its status
    assert _before(_state(workflow=WorkflowSpec("article", "1", ()))) is None  # its name and version


def test_a_run_pinned_to_a_version_the_app_does_not_serve_waits_for_one_that_does() -> None:
    pinned = WorkflowSpec("article", "9", ())
    e = outcome_before_lease(_state(workflow=pinned), _app(), dry_run=False, retry=False, now=1_000)
    assert e is not None and (e.result, e.waiting_for, e.deactivate) == ("not_served", "article@9", False)
    assert "this App serves article@1" in e.detail
    # never a block, whatever the request: a retry or a dry run is not served either
    assert _before(_state(workflow=pinned), retry=True)[0] == "not_served"  # type: ignore[index]
    assert _before(_state(workflow=pinned), dry_run=True)[0] == "not_served"  # type: ignore[index]
    # settled runs need no member of their version: any member may say so
    assert _before(_state(RunStatus.COMPLETED, workflow=pinned))[0] == "nothing_to_do"  # type: ignore[index]
    # an App serving both versions serves the run
    v9 = _workflow("9")
    both = _app(_workflow(), v9)
    assert outcome_before_lease(_state(workflow=v9.spec()), both, dry_run=False, retry=False,
                                now=1_000) is None


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_complete_run_has_nothing_to_do(dry_run: bool) -> None:
    assert _before(_state(RunStatus.COMPLETED), dry_run=dry_run) == (
        "nothing_to_do", "the run is complete", not dry_run)


@pytest.mark.parametrize(("error", "detail"), [
    (None, "the run was cancelled"),
    (ErrorInfo("Cancelled", "by ops"), "the run was cancelled (by ops)"),
])
def test_a_cancelled_run_is_never_resumed(error: ErrorInfo | None, detail: str) -> None:
    assert _before(_state(RunStatus.CANCELLED, last_error=error)) == ("cancelled", detail, True)
    assert _before(_state(RunStatus.CANCELLED), dry_run=True) == ("cancelled", "the run was cancelled", False)


def test_a_failed_run_is_resumed_only_when_retried() -> None:
    failed = _state(RunStatus.FAILED, last_error=ErrorInfo("ToolError", "boom", True))
    assert _before(failed) == (
        "failed", "the run failed (ToolError); a person retries it: runlog retry RUN", True)
    assert _before(_state(RunStatus.FAILED))[1].startswith("the run failed (unknown error)")  # type: ignore[index]
    assert _before(failed, retry=True) is None
    assert _before(failed, dry_run=True) == ("planned", "", False)


@pytest.mark.parametrize(("deadline", "now", "waits"), [(0, 5, True), (10, 5, True), (10, 10, False)])
def test_a_waiting_run_waits_until_its_deadline(deadline: int, now: int, waits: bool) -> None:
    state = _state(RunStatus.WAITING, waiting=WaitInfo("publish/approve/0", "approve", deadline))
    got = _before(state, now=now)
    if waits:
        assert got == ("waiting", "waits for signal 'approve' (publish/approve/0); nothing to do before it",
                       False)
    else:
        assert got is None  # the deadline passed: the wait's policy decides, under the lease


def test_a_blocked_run_is_not_resumed_again_until_a_person_moves_it() -> None:
    """A resume is final: a second request for a run the first one blocked takes no lease."""
    blocked = _state(RunStatus.BLOCKED, last_error=ErrorInfo("ResumeBlocked", "call x diverged", False))
    result, detail, deactivate = _before(blocked) or ("", "", False)
    assert (result, deactivate) == ("blocked", True)
    assert "call x diverged" in detail and "runlog resolve" in detail
    assert _before(_state(RunStatus.BLOCKED))[1].startswith("the run is blocked (no reason recorded)")  # type: ignore[index]
    assert _before(blocked, dry_run=True) == ("planned", "", False)  # a dry run still shows the plan
    assert _before(blocked, retry=True) is None  # a person retries it once the cause is fixed
    # the operator's resolve makes the fold's status RUNNING again: then it is resumed
    assert _before(replace(blocked, status=RunStatus.RUNNING)) is None


def test_a_request_that_saw_an_earlier_epoch_is_superseded() -> None:
    run = _state(epoch=4)
    assert _before(run, seen_epoch=4) is None
    assert _before(run, seen_epoch=5) is None  # a later epoch than the run's: not stale
    assert _before(run, seen_epoch=None) is None  # unknown (the sweep, older requests)
    result, detail, deactivate = _before(run, seen_epoch=3) or ("", "", True)
    assert (result, deactivate) == ("superseded", False)  # the run stays active: the sweep's backstop
    assert "epoch 4" in detail and "3" in detail
    assert _before(run, seen_epoch=3, dry_run=True) == ("planned", "", False)
    # the run's own state decides first
    assert _before(_state(RunStatus.COMPLETED, epoch=4), seen_epoch=3)[0] == "nothing_to_do"  # type: ignore[index]


def test_a_dry_run_stops_at_the_plan_and_a_running_run_goes_on() -> None:
    assert _before(_state(), dry_run=True) == ("planned", "", False)
    assert _before(_state()) is None


# -- outcomes once the lease is taken ---------------------------------------------------------


def test_the_lease_must_be_seen_accepted_by_the_fold() -> None:
    ok = _state(epoch=3, last_seq=21)
    assert outcome_after_lease(ok, 3, 21) is None
    for confirmed in (None, replace(ok, epoch=4), replace(ok, last_seq=22)):
        e = outcome_after_lease(confirmed, 3, 21)
        assert e is not None and e.result == "contended" and not e.deactivate
        assert "not accepted by the fold" in e.detail


def test_a_run_cancelled_after_the_plan_is_left_alone() -> None:
    cancelled = _state(RunStatus.CANCELLED, epoch=3, last_seq=21, last_error=ErrorInfo("Cancelled", "ops"))
    e = outcome_after_lease(cancelled, 3, 21)
    assert e is not None and (e.result, e.detail, e.deactivate) == (
        "cancelled", "the run was cancelled (ops)", True)
