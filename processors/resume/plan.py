"""Resume's decisions, as pure functions of what its ports returned (no I/O here).

:meth:`runlog.processors.resume.Resumer.facts` reads a run through the resumer's ports (the event log,
the projection store, the artifact store, the effects ledger) into :class:`PlanFacts`;
:func:`decide_plan` turns those facts and the App into a :class:`ResumePlan`. The same facts
always give the same plan, so every decision is unit tested without services
(``tests/unit/resume``). :func:`outcome_before_lease` and :func:`outcome_after_lease` decide the
outcomes resume reaches without running anything (settled, waiting, dry run, contended).

The plan, in order:

1. a settled run (``COMPLETED``, ``CANCELLED``) is planned no further; a run without a workflow
   is blocked;
2. the newest checkpoint whose artifacts are all intact is chosen (:attr:`PlanFacts.checks`,
   newest first); when the run has checkpoints and none is intact, the run is blocked;
3. strict resume: the App must register the run's workflow at the recorded version with the
   recorded definition, else the run is blocked;
4. every call recorded for a stage not done as of the chosen checkpoint is guarded; its
   recorded result is reused when intact, else listed as unusable;
5. every open effect intent is planned by its tool's replay policy (:func:`plan_effect`), or
   reused from the effects ledger (a ``NEVER`` effect the ledger records done); every closed
   effect of a stage run again whose result is not reused is reused by its external id; a
   ``block`` among them blocks the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runlog.producers.internal import RecordedCall, label
from runlog.projections import CallRecord, CallStatus, EffectEntry, RunState, RunStatus
from runlog.schemas import ArtifactRef, Checkpoint, EffectStatus, ReplayPolicy, WorkflowSpec
from runlog.schemas.errors import WorkflowDefinitionError

if TYPE_CHECKING:
    from runlog.producers import App, Tool
    from runlog.producers.internal import LedgerEntry

__all__ = [
    "NO_WORKFLOW",
    "CheckpointCheck",
    "Early",
    "EffectPlan",
    "PlanFacts",
    "ResumePlan",
    "calls_to_guard",
    "chosen_checkpoint",
    "decide_plan",
    "fell_back",
    "needs_checkpoints",
    "outcome_after_lease",
    "outcome_before_lease",
    "plan_effect",
    "strict_refusal",
]

NO_WORKFLOW = "the run has no RUN_STARTED with a workflow"
_SETTLED = (RunStatus.COMPLETED, RunStatus.CANCELLED)


@dataclass(frozen=True)
class EffectPlan:
    """What resume does with one effect that has no recorded result."""

    delivery_key: str
    call_id: str | None
    tool: str | None
    policy: ReplayPolicy | None
    action: str
    """``rerun`` | ``rerun_same_key`` | ``reconcile`` | ``reuse_external`` (the log has its
    result) | ``reuse_ledger`` (the effects ledger has it) | ``block``."""
    detail: str = ""
    external_id: str | None = None
    """For ``reuse_ledger``: the external id the ledger holds."""


@dataclass
class ResumePlan:
    """Everything resume found and decided before touching the run (``--dry-run`` prints it)."""

    run_id: str
    status: str
    partition: int
    events_read: int
    checkpoint: Checkpoint | None
    checkpoints_rejected: list[tuple[str, str]] = field(default_factory=list)
    artifacts_checked: int = 0
    from_stage: str | None = None
    stage_outputs: dict[str, ArtifactRef] = field(default_factory=dict)
    reused_calls: dict[str, ArtifactRef] = field(default_factory=dict)
    recorded: dict[str, RecordedCall] = field(default_factory=dict)
    """Every call the log records for the stages resume runs again: what the determinism guard
    compares the new calls with (``result`` set for the ones in ``reused_calls``)."""
    unusable_results: list[tuple[str, str]] = field(default_factory=list)
    """``(call_id, problem)``: recorded results that are missing or corrupt, so not reused."""
    effects: list[EffectPlan] = field(default_factory=list)
    blocked_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        cp = self.checkpoint
        return {
            "run_id": self.run_id,
            "status": self.status,
            "partition": self.partition,
            "events_read": self.events_read,
            "checkpoint": None if cp is None else {
                "checkpoint_id": cp.checkpoint_id, "stage": cp.stage, "last_seq": cp.last_seq,
                "offset": cp.offset, "next_stage": cp.next_stage,
                "artifacts": [label(a) for a in cp.artifacts],
            },
            "checkpoints_rejected": [{"checkpoint_id": c, "reason": r}
                                     for c, r in self.checkpoints_rejected],
            "artifacts_checked": self.artifacts_checked,
            "from_stage": self.from_stage,
            "reused_calls": sorted(self.reused_calls),
            "guarded_calls": sorted(self.recorded),
            "unusable_results": [{"call_id": c, "problem": p} for c, p in self.unusable_results],
            "effects": [{"delivery_key": e.delivery_key, "call_id": e.call_id, "tool": e.tool,
                         "policy": e.policy.value if e.policy else None, "action": e.action,
                         "detail": e.detail} for e in self.effects],
            "blocked_reason": self.blocked_reason,
        }


# -- the facts --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckpointCheck:
    """One checkpoint whose artifacts were verified, with the run's state as of it."""

    checkpoint: Checkpoint
    state: RunState
    checked: int
    """How many artifacts were verified."""
    problem: str | None
    """Every problem found (``ArtifactMissing: ...; ArtifactCorrupt: ...``); None: all intact."""


@dataclass(frozen=True)
class PlanFacts:
    """What the resumer's ports returned about one run: all :func:`decide_plan` looks at."""

    state: RunState
    """The run as of the end of the log (the nearest snapshot plus the folded tail)."""
    events_read: int
    """Events of the tail read from the log to get ``state``."""
    checks: tuple[CheckpointCheck, ...] = ()
    """Checkpoints verified, in the order tried: newest first, up to the first intact one."""
    checkpoints_known: int = 0
    """How many checkpoints the run has, as far as they were read (0: none, start from the
    first stage)."""
    calls_after: Mapping[str, CallRecord] = field(default_factory=dict)
    """Calls completed after the chosen checkpoint, read from the log: only when resume fell
    back to an earlier checkpoint (the fold forgot them, they are still facts)."""
    calls_after_read: int = 0
    """Events read from the log to find ``calls_after``."""
    result_problems: Mapping[str, str] = field(default_factory=dict)
    """``call_id -> problem`` of recorded results that failed verification (absent: intact)."""
    ledger: Mapping[str, LedgerEntry] = field(default_factory=dict)
    """The effects ledger's entries for the delivery keys of the run's open effects."""


# -- what the facts need (shared by the reader of facts and the plan) --------------------------


def needs_checkpoints(state: RunState) -> bool:
    """Whether the plan goes on to the checkpoints (not a settled run, nor one without workflow)."""
    return state.status not in _SETTLED and state.workflow is not None


def chosen_checkpoint(checks: tuple[CheckpointCheck, ...]) -> CheckpointCheck | None:
    """The first checkpoint tried whose artifacts are all intact."""
    return next((c for c in checks if c.problem is None), None)


def fell_back(checks: tuple[CheckpointCheck, ...]) -> bool:
    """A checkpoint was chosen after a newer one was rejected."""
    return chosen_checkpoint(checks) is not None and any(c.problem is not None for c in checks)


def strict_refusal(wf: WorkflowSpec, app: App) -> str | None:
    """Why the App may not continue a run of ``wf`` (None: it registers exactly that workflow)."""
    try:
        registered = app.registry.get(wf.name, wf.version)
    except WorkflowDefinitionError as err:
        return f"strict resume refused: {err}"
    if registered.spec() != wf:
        return (f"strict resume refused: workflow {wf.name!r} version {wf.version!r} "
                "is registered with a different definition than the run recorded")
    return None


def calls_to_guard(state: RunState, chosen: CheckpointCheck | None,
                   calls_after: Mapping[str, CallRecord]) -> dict[str, CallRecord]:
    """The recorded calls of the stages resume runs again (not done as of ``chosen``)."""
    calls: dict[str, CallRecord] = dict(state.calls)
    if calls_after:
        calls = {**calls_after, **calls}
    done = set(chosen.state.completed_stages) if chosen is not None else set()
    # an upgrade's superseded calls are history: the new code's calls are not compared with them
    return {k: c for k, c in calls.items() if c.stage not in done and c.status is not CallStatus.SUPERSEDED}


# -- the decisions ----------------------------------------------------------------------------


def plan_effect(eff: EffectEntry, reused_calls: Mapping[str, ArtifactRef],
                tools: Mapping[str, Tool]) -> EffectPlan:
    """What resume does with one open effect intent, by its tool's replay policy (pure)."""
    policy = eff.replay_policy
    if eff.call_id in reused_calls:
        return EffectPlan(eff.delivery_key, eff.call_id, eff.tool, policy, "reuse",
                          "the call's result is recorded")
    if policy is ReplayPolicy.NEVER or policy is None:
        return EffectPlan(eff.delivery_key, eff.call_id, eff.tool, policy, "block",
                          f"{eff.tool} ({policy.value if policy else 'unknown policy'}) was "
                          f"interrupted after its intent for {eff.target} (delivery key "
                          f"{eff.delivery_key}): a person must check whether it happened")
    if policy is ReplayPolicy.RECONCILE_FIRST:
        if eff.tool not in tools:
            return EffectPlan(eff.delivery_key, eff.call_id, eff.tool, policy, "block",
                              f"tool {eff.tool!r} is not registered, so it cannot be reconciled")
        return EffectPlan(eff.delivery_key, eff.call_id, eff.tool, policy, "reconcile",
                          f"ask {eff.target} for delivery key {eff.delivery_key[:16]}...")
    if policy is ReplayPolicy.IDEMPOTENT:
        return EffectPlan(eff.delivery_key, eff.call_id, eff.tool, policy, "rerun_same_key",
                          "call again with the recorded idempotency key (if the stage makes the same call "
                          "again; a call with other arguments blocks the run as diverged)")
    return EffectPlan(eff.delivery_key, eff.call_id, eff.tool, policy, "rerun", "safe to run again")


def _open_effect(eff: EffectEntry, facts: PlanFacts, plan: ResumePlan, app: App) -> EffectPlan:
    known = facts.ledger.get(eff.delivery_key)
    if known is not None and known.done and eff.call_id not in plan.reused_calls \
            and eff.replay_policy is ReplayPolicy.NEVER:  # the others ask again, or call again
        # the writer recorded the external id in the ledger after the call returned and died
        # before the log had it: the effect happened, with that id
        return EffectPlan(eff.delivery_key, eff.call_id, eff.tool, eff.replay_policy, "reuse_ledger",
                          f"the effects ledger records it done: external id {known.external_id} "
                          f"(run {known.run_id}, {known.source})", known.external_id)
    return plan_effect(eff, plan.reused_calls, app.tools)


def _closed_effect(eff: EffectEntry, state: RunState, plan: ResumePlan, done: set[str]) -> EffectPlan | None:
    if eff.status is EffectStatus.FAILED or not eff.external_id:
        return None  # it did not happen (the tool failed, or an operator resolved it not done)
    rec = state.calls.get(eff.call_id or "")
    if rec is None or rec.call_id in plan.reused_calls or rec.stage in done:
        return None
    return EffectPlan(eff.delivery_key, eff.call_id, eff.tool, eff.replay_policy, "reuse_external",
                      f"external id {eff.external_id} already recorded")


def _guard(call: CallRecord, problem: str | None, plan: ResumePlan) -> None:
    """Guard a recorded call; reuse its result when it has one that is intact."""
    result = None
    if call.status is CallStatus.RESULT and call.result is not None:
        if problem is None:
            result = call.result
            plan.reused_calls[call.call_id] = call.result
        else:  # never handed back: the call runs again under its policy
            plan.unusable_results.append((call.call_id, problem))
    plan.recorded[call.call_id] = RecordedCall(call.call_id, call.tool, call.request_hash, result, call.args)


def _choose(facts: PlanFacts, plan: ResumePlan) -> CheckpointCheck | None:
    for check in facts.checks:
        plan.artifacts_checked += check.checked
        if check.problem is None:
            return check
        plan.checkpoints_rejected.append((check.checkpoint.checkpoint_id, check.problem))
    return None


def decide_plan(facts: PlanFacts, app: App) -> ResumePlan:
    """How to resume the run ``facts`` describe, for ``app`` (pure: see the module docstring)."""
    state = facts.state
    plan = ResumePlan(state.run_id, state.status.value, state.partition, facts.events_read, None)
    if not needs_checkpoints(state):
        if state.workflow is None and state.status not in _SETTLED:
            plan.blocked_reason = NO_WORKFLOW
        return plan
    wf = state.workflow
    assert wf is not None
    chosen = _choose(facts, plan)
    if chosen is None and facts.checkpoints_known:
        plan.blocked_reason = ("no checkpoint has intact artifacts: "
                               + "; ".join(f"{c}: {r}" for c, r in plan.checkpoints_rejected))
        return plan
    if chosen is not None:
        plan.checkpoint = chosen.checkpoint
        plan.stage_outputs = dict(chosen.state.stage_outputs)
        plan.from_stage = chosen.checkpoint.next_stage
        done = set(chosen.state.completed_stages)
    else:
        plan.from_stage = wf.next_stage(None)
        done = set()
    refusal = strict_refusal(wf, app)
    if refusal is not None:
        plan.blocked_reason = refusal
        return plan
    after: Mapping[str, CallRecord] = {}
    if fell_back(facts.checks):  # the calls of the stages after the chosen checkpoint are facts still
        after = facts.calls_after
        plan.events_read += facts.calls_after_read
    for call in calls_to_guard(state, chosen, after).values():
        _guard(call, facts.result_problems.get(call.call_id), plan)
    plan.effects = [_open_effect(e, facts, plan, app) for e in state.open_effects.values()]
    plan.effects += [p for e in state.closed_effects.values() if (p := _closed_effect(e, state, plan, done))]
    blocks = [e for e in plan.effects if e.action == "block"]
    if blocks:
        plan.blocked_reason = "; ".join(e.detail for e in blocks)
    return plan


# -- the outcomes reached without running anything ---------------------------------------------


@dataclass(frozen=True, slots=True)
class Early:
    """An outcome resume reaches before taking the lease (or right after, without running)."""

    result: str
    detail: str = ""
    deactivate: bool = False
    """Drop the run from the active-runs registry (it needs no resumer any more)."""
    waiting_for: str | None = None
    """``not_served``: the ``workflow@version`` the run waits for a member serving."""


def _cancelled(state: RunState) -> str:
    err = state.last_error
    return "the run was cancelled" + (f" ({err.message})" if err is not None and err.message else "")


def outcome_before_lease(state: RunState, app: App, *, dry_run: bool, retry: bool,
                         now: int, seen_epoch: int | None = None, woken: bool = False) -> Early | None:
    """The outcome of a resume decided from the run alone (None: take the lease and go on).

    ``not_mine`` (the App registers no workflow of the run's name), ``nothing_to_do`` (complete),
    ``cancelled``, ``blocked`` (a blocked run without ``retry`` waits for a person: ``runlog
    resolve``, ``runlog retry`` once the cause is fixed, or a branch moves it, a plain resume does
    not; dry runs still plan it), ``failed`` (a failed run without
    ``retry``), ``waiting`` (for a signal whose deadline, if any, is after ``now``; not when ``woken``: a run
    waiting for child runs all of which have ended, ``runlog.producers.internal.children_ended``),
    ``not_served`` (the App registers the run's workflow, but not at the version the run is pinned
    to: a member serving that version continues it, :mod:`runlog.processors.resume._versions`; never a
    block), ``superseded`` (the run's epoch is later than ``seen_epoch``, the one the request saw:
    another resume or an operator moved the run since), ``planned`` (``dry_run``).

    A resume is exclusive and final: every outcome here appends nothing and calls nothing, so a
    second request for a run the first one settled (blocked, completed, ...) does no work again."""
    wf = state.workflow
    if wf is not None and wf.name not in app.registry:
        return Early("not_mine", f"workflow {wf.name!r} is not registered by this App")
    if state.status is RunStatus.COMPLETED:
        return Early("nothing_to_do", "the run is complete", deactivate=not dry_run)
    if state.status is RunStatus.CANCELLED:
        return Early("cancelled", _cancelled(state), deactivate=not dry_run)
    if state.status is RunStatus.BLOCKED and not dry_run and not retry:
        err = state.last_error
        why = err.message if err is not None and err.message else "no reason recorded"
        return Early("blocked", f"the run is blocked ({why}); a person resolves it (runlog resolve), "
                     "retries it once the cause is fixed (runlog retry) or branches it", deactivate=True)
    if state.status is RunStatus.FAILED and not retry and not dry_run:
        err = state.last_error
        return Early("failed", f"the run failed ({err.kind if err else 'unknown error'}); a person "
                     "retries it: runlog retry RUN", deactivate=True)
    w = state.waiting
    if state.status is RunStatus.WAITING and w is not None and (w.deadline_ms <= 0 or now < w.deadline_ms) \
            and not woken:
        return Early("waiting", f"waits for signal {w.signal!r} ({w.call_id}); nothing to do before it")
    if wf is not None and not app.registry.serves(wf.name, wf.version):
        served = ", ".join(f"{wf.name}@{v}" for v in app.registry.versions(wf.name))
        return Early("not_served", f"the run is pinned to {wf.name}@{wf.version}; this App serves {served}: "
                     "a member serving it continues the run", waiting_for=f"{wf.name}@{wf.version}")
    if seen_epoch is not None and state.epoch > seen_epoch and not dry_run:
        return Early("superseded", f"the run is at epoch {state.epoch}, later than the {seen_epoch} this "
                     "request saw: another resume or an operator moved it since")
    if dry_run:
        return Early("planned")
    return None


def outcome_after_lease(confirmed: RunState | None, epoch: int, last_seq: int) -> Early | None:
    """The outcome decided once ``LEASE_ACQUIRED`` at ``epoch`` / ``last_seq`` was appended and the
    run's tail folded again into ``confirmed`` (None: run the plan)."""
    if confirmed is None or confirmed.epoch != epoch or confirmed.last_seq != last_seq:
        return Early("contended", "LEASE_ACQUIRED was not accepted by the fold: another writer moved the run")
    if confirmed.status is RunStatus.CANCELLED:  # cancelled after the plan was made
        return Early("cancelled", _cancelled(confirmed), deactivate=True)
    return None
