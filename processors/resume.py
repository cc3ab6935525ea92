"""The resume protocol: continue a crashed run from its last verified checkpoint.

One function, :meth:`Resumer.resume`, used by every entry point (the resumer
consumer, ``runlog resume``, the demo, the fault suite). In order:

1. load the run: its latest checkpoint snapshot from Redis, else its projected
   state, else a fold of its partition from the start (Redis is only a cache);
2. fold only the tail: seek the run's partition to the snapshot's offset and
   fold the events after it, so the cost grows with the tail, not the history;
3. verify every artifact of the latest checkpoint (exists, sha256 matches),
   falling back to an earlier intact checkpoint, or blocking the run;
4. check the registered workflow is the one the run was started with (strict
   resume: a different version or definition blocks the run);
5. take the single-writer lease at a new epoch: ``LEASE_ACQUIRED`` is appended,
   acknowledged, and read back accepted by the fold before anything else;
6. reconcile every effect intent without a result, by its tool's policy
   (``SAFE`` runs again, ``IDEMPOTENT`` runs again with the same idempotency key,
   ``RECONCILE_FIRST`` asks the external system and records ``EFFECT_RECONCILED``
   when it already holds the result, ``NEVER`` blocks the run for a person);
7. continue from the checkpoint's ``next_stage`` with the pinned inputs, reusing
   the recorded results of calls completed after the checkpoint.

The model is never asked where the run was: everything comes from the log.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from producers import App, ArtifactStore, LocalArtifactStore, Runner, Tool, Workflow
from producers._context import RecordedCall
from producers._lease import LeaseHeld
from producers._writer import RunWriter
from projections import RedisStore, RunState, RunStatus, fold, read_run_tail, run_events
from projections._state import CallRecord, CallStatus, EffectEntry
from schemas import (
    ArtifactError,
    ArtifactRef,
    Checkpoint,
    ConfigError,
    EffectStatus,
    ErrorInfo,
    EventType,
    ReplayPolicy,
    RunEvent,
    RunlogError,
    Settings,
    Topics,
    now_ms,
    partition_for,
)
from schemas.errors import LeaseLost, ResumeBlocked, ToolError, VerificationFailed, WorkflowDefinitionError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = [
    "App",
    "EffectPlan",
    "ResumeOutcome",
    "ResumePlan",
    "Resumer",
    "UnknownRun",
    "load_app",
    "plan_effect",
]


class UnknownRun(RunlogError):
    """Neither Redis nor the log knows this run."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"no run {run_id!r} in Redis or on the events topic")


def load_app(spec: str) -> App:
    """Import ``module:attribute`` and return the :class:`App` it names (or a factory's result).

    Modules are found in the current directory first, as ``python -m`` does (the ``runlog``
    console script alone would not look there)."""
    import os
    import sys

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"--app must look like module:attribute, got {spec!r}")
    cwd = os.getcwd()
    if not sys.path or sys.path[0] not in ("", cwd):
        sys.path.insert(0, cwd)
        importlib.invalidate_caches()
    try:
        obj: Any = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"cannot load app {spec!r}: {err}") from err
    if callable(obj) and not isinstance(obj, App):
        obj = obj()
    if not isinstance(obj, App):
        raise ConfigError(f"{spec!r} is a {type(obj).__name__}, not a producers.App")
    return obj


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
                "artifacts": [a.uri for a in cp.artifacts],
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


@dataclass(frozen=True)
class ResumeOutcome:
    """How a resume ended: ``completed``, ``blocked``, ``contended`` (another writer holds
    the run), ``failed`` (a stage failed; or the run had failed and was not retried: nothing
    done), ``cancelled`` (an operator cancelled the run: nothing done, no lease taken),
    ``nothing_to_do``, ``planned`` (dry run) or ``not_mine`` (the App registers no workflow of
    the run's name: nothing was done, no lease taken, nothing appended; another App's resumer
    owns the run)."""

    run_id: str
    result: str
    plan: ResumePlan
    epoch: int = 0
    detail: str = ""


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


class Resumer:
    """Runs the resume protocol for an application on the real services.

    Args:
        settings: where Kafka, Redis and the artifact store are.
        app: the application's workflows, tools and inputs.
        runner: the producer side (one is made from ``settings`` when None).
        metrics_registry: when the runner is made here, its writer counts its appends in this
            ``prometheus_client`` registry (``runlog_writer_*``).
    """

    def __init__(self, settings: Settings, app: App, *, runner: Runner | None = None,
                 artifacts: ArtifactStore | None = None,
                 metrics_registry: CollectorRegistry | None = None) -> None:
        self.settings = settings
        self.app = app
        self.artifacts = artifacts or LocalArtifactStore(settings.artifact_root)
        self._own_runner = runner is None
        self._writer = RunWriter(settings, metrics_registry=metrics_registry) \
            if runner is None and metrics_registry is not None else None
        self.runner = runner or Runner.from_settings(settings, source=app.source, store=self.artifacts,
                                                     writer=self._writer)
        self.projection = RedisStore.from_settings(settings)
        self._partitions: int | None = None

    def close(self) -> None:
        try:
            if self._own_runner:
                self.runner.close()
        finally:
            if self._writer is not None:  # the runner closes only a writer it made itself
                self._writer.close()

    def __enter__(self) -> Resumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- 1 and 2: load the run, fold the tail ------------------------------------------------

    def partition_of(self, run_id: str) -> int:
        if self._partitions is None:
            from confluent_kafka.admin import AdminClient

            topic = Topics.of(self.settings).events
            md = AdminClient(self.settings.admin_config()).list_topics(topic, timeout=10)
            self._partitions = len(md.topics[topic].partitions) or self.settings.partitions
        return partition_for(run_id, self._partitions)

    def load(self, run_id: str) -> tuple[RunState, int]:
        """The run's current state from the nearest snapshot plus the tail of the log."""
        snapshot: RunState | None = None
        stored = self.projection.checkpoints(run_id, last=1)
        snapshot = stored[-1].state if stored else self.projection.load_state(run_id)
        if snapshot is not None and snapshot.partition >= 0:
            state, n = read_run_tail(self.settings, run_id, snapshot.partition, snapshot.offset + 1,
                                     snapshot)
        else:
            state, n = read_run_tail(self.settings, run_id, self.partition_of(run_id), 0, None)
        if state is None:
            raise UnknownRun(run_id)
        return state, n

    def _checkpoint_history(self, state: RunState) -> list[tuple[Checkpoint, RunState]]:
        """Every checkpoint of the run with the state as of it, oldest first."""
        stored = self.projection.checkpoints(state.run_id)
        history = [(sc.checkpoint, sc.state) for sc in stored]
        known = {c.checkpoint_id for c, _ in history}
        if all(e.checkpoint_id in known for e in state.checkpoints):
            if state.checkpoint is not None and state.checkpoint.checkpoint_id not in known:
                history.append((state.checkpoint, state))
            return history
        # Redis lost some snapshots: fold the run from the start and keep each checkpoint's state.
        return self._history_from_log(state)

    def _events_from(self, run_id: str, partition: int, offset: int) -> Iterator[tuple[int, RunEvent]]:
        """The run's decodable events on its partition from ``offset`` to the high watermark."""
        return run_events(self.settings, run_id, partition, offset)

    def _history_from_log(self, state: RunState) -> list[tuple[Checkpoint, RunState]]:
        out: list[tuple[Checkpoint, RunState]] = []
        cur: RunState | None = None
        for offset, ev in self._events_from(state.run_id, state.partition, 0):
            cur, outcome = fold(cur, ev, (state.partition, offset))
            if outcome.checkpoint is not None:
                out.append((outcome.checkpoint, cur))
        return out

    def _results_after(self, cp: Checkpoint, snap: RunState) -> tuple[dict[str, CallRecord], int]:
        """Calls completed (``TOOL_RESULT`` accepted) after checkpoint ``cp``, read from the log.

        Used when resume falls back to an earlier checkpoint: the fold forgets the calls
        of a stage once it is verified, but their recorded results are still facts.
        """
        out: dict[str, CallRecord] = {}
        hashes: dict[str, str | None] = {}
        n = 0
        if cp.partition < 0:
            return out, n
        cur = snap
        for offset, ev in self._events_from(cp.run_id, cp.partition, cp.offset + 1):
            n += 1
            cur, outcome = fold(cur, ev, (cp.partition, offset))
            if outcome.accepted and ev.type is EventType.TOOL_CALLED and ev.call_id:
                hashes[ev.call_id] = ev.request_hash
            if outcome.accepted and ev.type is EventType.TOOL_RESULT and ev.call_id \
                    and ev.payload_ref is not None:
                out[ev.call_id] = CallRecord(call_id=ev.call_id, tool=ev.tool, policy=ev.replay_policy,
                                             status=CallStatus.RESULT, stage=ev.stage, seq=ev.seq,
                                             result=ev.payload_ref, request_hash=hashes.get(ev.call_id))
        return out, n

    # -- 3 to 6: the plan --------------------------------------------------------------------

    def _intact(self, refs: Iterable[ArtifactRef]) -> tuple[int, str | None]:
        """How many artifacts were checked, and every problem found (None: all intact)."""
        n, problems = 0, []
        for ref in refs:
            n += 1
            try:
                self.artifacts.verify(ref)
            except ArtifactError as err:
                problems.append(f"{type(err).__name__}: {err}")
        return n, "; ".join(problems) if problems else None

    def plan(self, run_id: str) -> tuple[ResumePlan, RunState]:
        """Decide how to resume, changing nothing (no lease, no event, no external call)."""
        state, n = self.load(run_id)
        plan = ResumePlan(run_id, state.status.value, state.partition, n, None)
        if state.status in (RunStatus.COMPLETED, RunStatus.CANCELLED):
            return plan, state
        wf = state.workflow
        if wf is None:
            plan.blocked_reason = "the run has no RUN_STARTED with a workflow"
            return plan, state
        # 3. the newest checkpoint whose artifacts are all intact
        chosen: tuple[Checkpoint, RunState] | None = None
        newest = self.projection.checkpoints(state.run_id, last=1) if state.checkpoint else []
        if newest and state.checkpoint is not None \
                and newest[-1].checkpoint.checkpoint_id == state.checkpoint.checkpoint_id:
            # The usual case: the latest checkpoint is projected. The whole history is read only
            # when it fails verification, so a plan's cost does not grow with the checkpoint count.
            history = [(newest[-1].checkpoint, newest[-1].state)]
        else:
            history = self._checkpoint_history(state) if state.checkpoints else []
        only_latest = len(newest) == 1 and len(history) == 1
        tried: set[str] = set()
        while True:
            for cp, snap in reversed(history):
                if cp.checkpoint_id in tried:
                    continue
                tried.add(cp.checkpoint_id)
                checked, problem = self._intact(cp.artifacts)
                plan.artifacts_checked += checked
                if problem is None:
                    chosen = (cp, snap)
                    break
                plan.checkpoints_rejected.append((cp.checkpoint_id, problem))
            if chosen is not None or not only_latest:
                break
            only_latest = False
            history = self._checkpoint_history(state)  # fall back beyond the latest
        if history and chosen is None:
            plan.blocked_reason = ("no checkpoint has intact artifacts: "
                                   + "; ".join(f"{c}: {r}" for c, r in plan.checkpoints_rejected))
            return plan, state
        if chosen is not None:
            plan.checkpoint = chosen[0]
            plan.stage_outputs = dict(chosen[1].stage_outputs)
            plan.from_stage = chosen[0].next_stage
            done_stages = set(chosen[1].completed_stages)
        else:
            plan.from_stage = wf.next_stage(None)
            done_stages = set()
        # 4. strict resume: the registered workflow must be the recorded one
        try:
            registered = self.app.registry.get(wf.name, wf.version)
        except WorkflowDefinitionError as err:
            plan.blocked_reason = f"strict resume refused: {err}"
            return plan, state
        if registered.spec() != wf:
            plan.blocked_reason = (f"strict resume refused: workflow {wf.name!r} version {wf.version!r} "
                                   "is registered with a different definition than the run recorded")
            return plan, state
        # 6 (planned): recorded results to reuse, effects to reconcile
        calls = dict(state.calls)
        if chosen is not None and plan.checkpoints_rejected:
            # fell back: the calls of the stages after the chosen checkpoint are facts still
            found, read = self._results_after(chosen[0], chosen[1])
            plan.events_read += read
            calls = {**found, **calls}
        for call in calls.values():
            if call.stage in done_stages:
                continue
            result = None
            if call.status is CallStatus.RESULT and call.result is not None:
                _, problem = self._intact([call.result])
                if problem is None:
                    result = call.result
                    plan.reused_calls[call.call_id] = call.result
                else:  # never handed back: the call runs again under its policy
                    plan.unusable_results.append((call.call_id, problem))
            plan.recorded[call.call_id] = RecordedCall(call.call_id, call.tool, call.request_hash, result)
        ledger = self.runner.ledger
        for eff in state.open_effects.values():
            known = ledger.lookup(eff.delivery_key) if ledger is not None else None
            if known is not None and known.done and eff.call_id not in plan.reused_calls \
                    and eff.replay_policy is ReplayPolicy.NEVER:  # the others ask again, or call again
                # the writer recorded the external id in the ledger after the call returned and
                # died before the log had it: the effect happened, with that id
                plan.effects.append(EffectPlan(
                    eff.delivery_key, eff.call_id, eff.tool, eff.replay_policy, "reuse_ledger",
                    f"the effects ledger records it done: external id {known.external_id} "
                    f"(run {known.run_id}, {known.source})", known.external_id))
                continue
            plan.effects.append(plan_effect(eff, plan.reused_calls, self.app.tools))
        for eff in state.closed_effects.values():
            rec = state.calls.get(eff.call_id or "")
            if eff.status is EffectStatus.FAILED or not eff.external_id:
                continue  # it did not happen (the tool failed, or an operator resolved it not done)
            if rec is not None and rec.call_id not in plan.reused_calls \
                    and rec.stage not in done_stages:
                plan.effects.append(EffectPlan(eff.delivery_key, eff.call_id, eff.tool,
                                               eff.replay_policy, "reuse_external",
                                               f"external id {eff.external_id} already recorded"))
        blocks = [e for e in plan.effects if e.action == "block"]
        if blocks:
            plan.blocked_reason = "; ".join(e.detail for e in blocks)
        return plan, state

    # -- the protocol --------------------------------------------------------------------------

    def resume(self, run_id: str, *, dry_run: bool = False, force: bool = False, retry: bool = False,
               attributes: Mapping[str, str] | None = None) -> ResumeOutcome:
        """Resume a run (see the module docstring). ``dry_run`` only returns the plan.

        A ``CANCELLED`` run is never resumed (outcome ``cancelled``, no lease taken). A ``FAILED``
        run is resumed only with ``retry`` (:func:`processors.operate.retry_run`, which checks the
        failure was retryable or forced); otherwise the outcome is ``failed`` and nothing is done.
        ``attributes`` go on the ``LEASE_ACQUIRED`` (who acts, for an operator's retry)."""
        plan, state = self.plan(run_id)
        if state.workflow is not None and state.workflow.name not in self.app.registry:
            return ResumeOutcome(run_id, "not_mine", plan, state.epoch,
                                 f"workflow {state.workflow.name!r} is not registered by this App")
        if state.status is RunStatus.COMPLETED:
            if not dry_run:
                self.runner.mark_inactive(run_id)
            return ResumeOutcome(run_id, "nothing_to_do", plan, state.epoch, "the run is complete")
        if state.status is RunStatus.CANCELLED:
            if not dry_run:
                self.runner.mark_inactive(run_id)
            return ResumeOutcome(run_id, "cancelled", plan, state.epoch, _cancelled(state))
        if state.status is RunStatus.FAILED and not retry and not dry_run:
            self.runner.mark_inactive(run_id)
            err = state.last_error
            return ResumeOutcome(run_id, "failed", plan, state.epoch,
                                 f"the run failed ({err.kind if err else 'unknown error'}); a person retries "
                                 "it: runlog retry RUN")
        w = state.waiting
        if state.status is RunStatus.WAITING and w is not None \
                and (w.deadline_ms <= 0 or now_ms() < w.deadline_ms):
            return ResumeOutcome(run_id, "waiting", plan, state.epoch,
                                 f"waits for signal {w.signal!r} ({w.call_id}); nothing to do before it")
        if dry_run:
            return ResumeOutcome(run_id, "planned", plan, state.epoch)
        wf = state.workflow
        assert wf is not None
        try:
            workflow: Workflow = self.app.registry.get(wf.name)
        except WorkflowDefinitionError:
            workflow = Workflow(wf.name, wf.version)  # only used to append RUN_BLOCKED
        params = self._params(state)
        # 5. the lease, seen accepted in the log before anything else
        try:
            session = self.runner.take_over(run_id, last_seq=state.last_seq, workflow=workflow,
                                            input_versions=state.input_versions, params=params,
                                            last_epoch=state.epoch, force=force,
                                            last_hash=state.last_hash, attributes=attributes)
        except LeaseHeld as err:
            return ResumeOutcome(run_id, "contended", plan, state.epoch, str(err))
        confirmed, _ = read_run_tail(self.settings, run_id, state.partition, state.offset + 1, state)
        if confirmed is None or confirmed.epoch != session.epoch or \
                confirmed.last_seq != session.last_seq:
            session.close(release=True)
            return ResumeOutcome(run_id, "contended", plan, state.epoch,
                                 "LEASE_ACQUIRED was not accepted by the fold: another writer moved the run")
        if confirmed.status is RunStatus.CANCELLED:  # cancelled after the plan was made
            session.close(release=True)
            self.runner.mark_inactive(run_id)
            return ResumeOutcome(run_id, "cancelled", plan, session.epoch, _cancelled(confirmed))
        try:
            if plan.blocked_reason is not None:
                self._block(session, plan.blocked_reason)
                return ResumeOutcome(run_id, "blocked", plan, session.epoch, plan.blocked_reason)
            reconciled = self._reconcile(session, state, plan)
            if plan.blocked_reason is not None:
                self._block(session, plan.blocked_reason)
                return ResumeOutcome(run_id, "blocked", plan, session.epoch, plan.blocked_reason)
            deadlines = {state.waiting.call_id: state.waiting.deadline_ms} if state.waiting else {}
            result = self.runner.execute(session, from_stage=plan.from_stage,
                                         stage_outputs=plan.stage_outputs,
                                         recorded_calls=plan.recorded, reconciled=reconciled,
                                         deadlines=deadlines)
        except ResumeBlocked as err:  # a call diverged, or an effect is in doubt in another run
            return ResumeOutcome(run_id, "blocked", plan, session.epoch, err.reason)
        except (VerificationFailed, ToolError) as err:
            return ResumeOutcome(run_id, "failed", plan, session.epoch, str(err))
        except LeaseLost as err:
            return ResumeOutcome(run_id, "contended", plan, session.epoch, str(err))
        finally:
            session.close(release=True)
        if result.waiting is not None:
            return ResumeOutcome(run_id, "waiting", plan, session.epoch,
                                 f"waits for signal {result.waiting!r}")
        return ResumeOutcome(run_id, "completed" if result.completed else "failed", plan, session.epoch)

    def _params(self, state: RunState) -> dict[str, Any]:
        ref = state.params_ref
        if ref is None:
            return {}
        doc = json.loads(self.artifacts.get(ref))
        return dict(doc) if isinstance(doc, dict) else {}

    def _block(self, session: Any, reason: str) -> None:
        session.append(EventType.RUN_BLOCKED, confirm=True,
                       error=ErrorInfo("ResumeBlocked", reason, False))
        self.runner.mark_inactive(session.run_id)

    def _reconcile(self, session: Any, state: RunState, plan: ResumePlan) -> dict[str, Mapping[str, Any]]:
        """Step 6: ask external systems about open intents; record what they already hold."""
        reconciled: dict[str, Mapping[str, Any]] = {}
        for i, eff in enumerate(plan.effects):
            call = state.calls.get(eff.call_id or "")
            entry = state.open_effects.get(eff.delivery_key) or state.closed_effects.get(eff.delivery_key)
            if eff.action == "reuse_external" and call is not None and entry is not None:
                record = self._ask(eff, call.args) if eff.policy is ReplayPolicy.RECONCILE_FIRST else None
                reconciled[call.call_id] = record or {"external_id": entry.external_id}
            if eff.action == "reuse_ledger" and call is not None and entry is not None:
                doc = {"external_id": eff.external_id}
                ref = self.artifacts.put(json.dumps(doc, sort_keys=True).encode(), "application/json")
                session.append(EventType.EFFECT_RECONCILED, confirm=True, stage=call.stage, tool=call.tool,
                               call_id=call.call_id, delivery_key=eff.delivery_key, target=entry.target,
                               replay_policy=eff.policy, external_id=eff.external_id, payload_ref=ref,
                               attributes={"source": "ledger"})
                reconciled[call.call_id] = doc
            if eff.action != "reconcile" or call is None or entry is None:
                continue
            record = self._ask(eff, call.args)
            if record is None:
                plan.effects[i] = EffectPlan(eff.delivery_key, eff.call_id, eff.tool, eff.policy,
                                             "rerun", f"{entry.target} holds no result: executing")
                continue
            ref = self.artifacts.put(json.dumps(dict(record), sort_keys=True).encode(), "application/json")
            session.append(EventType.EFFECT_RECONCILED, confirm=True, stage=call.stage, tool=call.tool,
                           call_id=call.call_id, delivery_key=eff.delivery_key, target=entry.target,
                           replay_policy=eff.policy, external_id=str(record.get("external_id")),
                           payload_ref=ref)
            reconciled[call.call_id] = record
            if self.runner.ledger is not None:
                self.runner.ledger.close(eff.delivery_key, state.run_id, call.call_id,
                                         EffectStatus.RECONCILED, str(record.get("external_id")))
            plan.effects[i] = EffectPlan(eff.delivery_key, eff.call_id, eff.tool, eff.policy,
                                         "reconciled", f"{entry.target} already holds "
                                         f"{record.get('external_id')}")
        return reconciled

    def _ask(self, eff: EffectPlan, args_ref: ArtifactRef | None) -> Mapping[str, Any] | None:
        tool = self.app.tools.get(eff.tool or "")
        if tool is None or tool.reconcile is None:
            return None
        args = json.loads(self.artifacts.get(args_ref)) if args_ref is not None else {}
        return tool.reconcile(eff.delivery_key, args)


def _cancelled(state: RunState) -> str:
    err = state.last_error
    return "the run was cancelled" + (f" ({err.message})" if err is not None and err.message else "")
