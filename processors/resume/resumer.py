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

The :class:`Resumer` takes its ports: the event log (:class:`~runlog.processors.resume.ports.RunEventReader`),
the projection store (:class:`~runlog.projections.store.ProjectionStore`), the artifact store and the
runner (its lease manager, effects ledger and writer). Steps 1 to 4 and the planning of 6 read
facts through them (:meth:`Resumer.facts`, :mod:`runlog.processors.resume.facts`); what to do is then
decided by pure functions of those facts (:mod:`runlog.processors.resume.plan`); this module acts.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from runlog.processors._tracing import Tracing
from runlog.processors.resume.facts import FactsReader, UnknownRun
from runlog.processors.resume.plan import (
    Early,
    EffectPlan,
    PlanFacts,
    ResumePlan,
    decide_plan,
    outcome_after_lease,
    outcome_before_lease,
    plan_effect,
)
from runlog.processors.resume.ports import KafkaRunEvents, RunEventReader
from runlog.producers import App, ArtifactStore, Runner, Workflow
from runlog.producers.internal import (
    CHILD,
    BudgetGuard,
    LeaseHeld,
    LedgerUnavailable,
    RunWriter,
    children_ended,
    limit_since_key,
    sealing,
    store_from_settings,
)
from runlog.projections import ProjectionStoreError, RunState, RunStatus
from runlog.projections.store import ProjectionStore
from runlog.schemas import (
    ArtifactRef,
    ConfigError,
    EffectStatus,
    ErrorInfo,
    EventType,
    ReplayPolicy,
    Settings,
    now_ms,
)
from runlog.schemas.errors import (
    ArtifactError,
    DeliveryError,
    LeaseLost,
    LogUnavailable,
    ResumeBlocked,
    RunCancelled,
    RunFailed,
    RunlogError,
    ToolError,
    VerificationFailed,
    WorkflowDefinitionError,
)
from runlog.schemas.internal import TraceContext, current, parse

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger("runlog.resumer")

__all__ = [
    "App",
    "EffectPlan",
    "ResumeOutcome",
    "ResumePlan",
    "Resumer",
    "UnknownRun",
    "describe",
    "load_app",
    "plan_effect",
]


def load_app(spec: str) -> App:
    """Import ``module:attribute`` and return the :class:`App` it names (or a factory's result).

    Modules are found in the current directory first, as ``python -m`` does (the ``runlog``
    console script alone would not look there). The module may also be a path (``./greet:app``,
    ``../apps/greet.py:app``): its folder is searched first and the file's stem imported."""
    import os
    import sys
    from pathlib import Path

    module_name, _, attr = spec.rpartition(":")
    if not module_name or not attr:
        raise ConfigError(f"--app must look like module:attribute, got {spec!r}")
    folder = os.getcwd()
    if "/" in module_name or module_name.startswith(".") or module_name.endswith(".py"):
        path = Path(module_name).expanduser().resolve()
        folder, module_name = str(path.parent), path.name.removesuffix(".py")
        if not (path.with_name(module_name + ".py").is_file() or (path.parent / module_name).is_dir()):
            raise ConfigError(f"cannot load app {spec!r}: no module {module_name!r} in {folder}")
    if not sys.path or sys.path[0] not in ("", folder):
        sys.path.insert(0, folder)
        importlib.invalidate_caches()
    try:
        obj: Any = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, TypeError, ValueError) as err:
        raise ConfigError(f"cannot load app {spec!r}: {err}") from err
    if callable(obj) and not isinstance(obj, App):
        obj = obj()
    if not isinstance(obj, App):
        raise ConfigError(f"{spec!r} is a {type(obj).__name__}, not a runlog.App")
    return obj


@dataclass(frozen=True)
class ResumeOutcome:
    """How a resume ended: ``completed``, ``blocked`` (this resume blocked the run, or it was
    blocked already: then nothing done, no lease taken), ``contended`` (another writer holds
    the run), ``failed`` (a stage failed; or the run had failed and was not retried: nothing
    done), ``cancelled`` (an operator cancelled the run: nothing done, no lease taken),
    ``superseded`` (the run's epoch is later than the one the request saw: nothing done),
    ``nothing_to_do``, ``planned`` (dry run), ``not_mine`` (the App registers no workflow of
    the run's name: nothing was done, no lease taken, nothing appended; another App's resumer
    owns the run) or ``not_served`` (the App registers the workflow but not the version the run is
    pinned to, ``waiting_for``: nothing done; a member serving it continues the run)."""

    run_id: str
    result: str
    plan: ResumePlan
    epoch: int = 0
    detail: str = ""
    waiting_for: str | None = None
    """``not_served``: the ``workflow@version`` the run waits for a member serving."""


NOT_ACTED = frozenset({"not_mine", "not_served"})
"""Outcomes of a resume this App left to another (nothing done): not counted as handled."""


Gate = Callable[[RunState], "Callable[[], None] | str | None"]
"""``gate(state)`` before a resume acts: a callable that frees what it admitted (called once the resume
returns), None (nothing to admit: act), or why not now (a text: the outcome is ``queued``, nothing is
done, and the run is asked for again)."""

QUEUED_RETRY_MS = 1000
"""How soon a resume its queue did not admit is asked for again (a ``WAITING`` run's timer; a
``RUNNING`` one is the sweep's at its next turn)."""


class Resumer:
    """Runs the resume protocol for an application, through its ports.

    Args:
        settings: where Kafka, Redis and the artifact store are (for the ports not given).
        app: the application's workflows, tools and inputs.
        runner: the producer side: the lease manager, effects ledger and writer resume acts
            with (one is made from ``settings`` when None).
        artifacts: the artifact store checkpoints and results are verified in (the local one
            at ``settings.artifact_root`` when None).
        projection: the projection store snapshots and checkpoints are read from; the caller
            owns it. When None, a Redis store is opened from ``settings`` and closed with the
            resumer.
        events: reads the run's events back from the log (the events topic on Kafka when None).
        metrics_registry: when the runner is made here, its writer counts its appends in this
            ``prometheus_client`` registry (``runlog_writer_*``).
        tracer_provider: where the spans of a resume (and of the runner made here) go; None: the
            global provider (:mod:`runlog.processors._tracing`, off with ``RUNLOG_TRACING=false``).
    """

    def __init__(self, settings: Settings, app: App, *, runner: Runner | None = None,
                 artifacts: ArtifactStore | None = None, projection: ProjectionStore | None = None,
                 events: RunEventReader | None = None,
                 metrics_registry: CollectorRegistry | None = None, tracer_provider: Any = None) -> None:
        self.settings = settings
        self.app = app
        self.tracing = Tracing(settings, tracer_provider)
        self.artifacts = sealing(artifacts, settings) if artifacts is not None \
            else store_from_settings(settings)
        self._own_runner = runner is None
        self._writer = RunWriter(settings, metrics_registry=metrics_registry) \
            if runner is None and metrics_registry is not None else None
        self.runner = runner or Runner.from_settings(settings, source=app.source, store=self.artifacts,
                                                     writer=self._writer, tracer=self.tracing.runner_tracer(),
                                                     prices=app.prices)
        self._own_projection: Any = None
        if projection is None:
            from runlog.projections.redis_store import RedisStore

            projection = self._own_projection = RedisStore.from_settings(settings)
        self.projection: ProjectionStore = projection
        self._own_events: KafkaRunEvents | None = None
        if events is None:
            events = self._own_events = KafkaRunEvents(settings)
        self.events: RunEventReader = events
        self.reader = FactsReader(app, self.projection, self.events, self.artifacts, self.runner.ledger)
        self.gate: Gate | None = None
        """Admits a resume that is about to act (a ``runlog worker``: a slot of the run's queue); None:
        every resume acts."""

    def close(self) -> None:
        try:
            if self._own_runner:
                self.runner.close()
        finally:
            if self._writer is not None:  # the runner closes only a writer it made itself
                self._writer.close()
            if self._own_projection is not None:
                self._own_projection.client.close()
            if self._own_events is not None:
                self._own_events.close()

    def __enter__(self) -> Resumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- 1 to 4 and the planning of 6: facts through the ports, then the pure plan ---------------

    def partition_of(self, run_id: str) -> int:
        return self.events.partition_of(run_id)

    def load(self, run_id: str) -> tuple[RunState, int]:
        """The run's current state from the nearest snapshot plus the tail of the log."""
        return self.reader.load(run_id)

    def facts(self, run_id: str) -> PlanFacts:
        """Read everything the plan decides from, through the ports (changes nothing)."""
        return self.reader.facts(run_id)

    def plan(self, run_id: str) -> tuple[ResumePlan, RunState]:
        """Decide how to resume, changing nothing (no lease, no event, no external call)."""
        facts = self.facts(run_id)
        return decide_plan(facts, self.app), facts.state

    # -- the protocol --------------------------------------------------------------------------

    def _early(self, run_id: str, early: Early, plan: ResumePlan, epoch: int) -> ResumeOutcome:
        if early.deactivate:
            self.runner.mark_inactive(run_id)
        return ResumeOutcome(run_id, early.result, plan, epoch, early.detail, early.waiting_for)

    def resume(self, run_id: str, *, dry_run: bool = False, force: bool = False, retry: bool = False,
               attributes: Mapping[str, str] | None = None, seen_epoch: int | None = None,
               request: TraceContext | None = None) -> ResumeOutcome:
        """Resume a run (see the module docstring). ``dry_run`` only returns the plan.

        A resume is exclusive and final: a ``CANCELLED`` run is never resumed (outcome
        ``cancelled``, no lease taken, nothing appended), nor is a run whose epoch is later than
        ``seen_epoch`` (the epoch the request saw; outcome ``superseded``). A ``FAILED`` or
        ``BLOCKED`` run is resumed only with ``retry`` (:func:`runlog.processors.operate.retry_run`: a
        person says the cause is fixed); otherwise the outcome is ``failed`` / ``blocked`` and
        nothing is done. ``attributes`` go on the ``LEASE_ACQUIRED`` (who acts, for an operator's retry).

        A resume that acts is a span ``runlog.resume`` continuing the run's trace (the context its
        ``RUN_STARTED`` recorded), linked to ``request`` (the resume request's context) and the caller's."""
        plan, state = self.plan(run_id)
        w = state.waiting  # a parent waiting for children, all of which have ended: resumed, not left waiting
        woken = w is not None and w.signal == CHILD and children_ended(self.runner.outcomes, state)
        early = outcome_before_lease(state, self.app, dry_run=dry_run, retry=retry, now=now_ms(),
                                     seen_epoch=seen_epoch, woken=woken)
        if early is not None:
            w = state.waiting
            if early.result == "waiting" and not dry_run and w is not None and state.workflow is not None:
                self.runner.mark_waiting(run_id, state.workflow.name, w.deadline_ms)  # woken at its time
            return self._early(run_id, early, plan, state.epoch)
        wf = state.workflow
        if wf is None:  # no accepted RUN_STARTED: nothing was started that could be resumed
            raise UnknownRun(f"run {run_id} has no accepted RUN_STARTED (status {state.status.value})")
        admitted = self.gate(state) if self.gate is not None else None
        if isinstance(admitted, str):  # its queue has no slot now: asked again soon, nothing done
            if state.status is RunStatus.WAITING:  # woken by a timer: armed again (a RUNNING one: the sweep)
                self.runner.mark_waiting(run_id, wf.name, now_ms() + QUEUED_RETRY_MS)
            return self._early(run_id, Early("queued", admitted), plan, state.epoch)
        try:
            return self._resume(state, plan, wf, force=force, attributes=attributes, request=request)
        finally:
            if admitted is not None:
                admitted()

    def _resume(self, state: RunState, plan: ResumePlan, wf: Any, *, force: bool,
                attributes: Mapping[str, str] | None, request: TraceContext | None) -> ResumeOutcome:
        """Take the lease and go on (the part of :meth:`resume` that acts)."""
        run_id = state.run_id
        try:
            workflow: Workflow = self.app.registry.get(wf.name, wf.version)
        except WorkflowDefinitionError:
            workflow = Workflow(wf.name, wf.version)  # only used to append RUN_BLOCKED
        run = parse(state.traceparent, state.tracestate)
        with self.tracing.span("runlog.resume", parent=run, links=(request, current() if run else None),
                               attributes={"run_id": run_id, "workflow": wf.name}) as span:
            # 5. the lease, seen accepted in the log before anything else
            taken = self._take_over(state, workflow, plan, force=force, attributes=attributes)
            outcome = taken if isinstance(taken, ResumeOutcome) else self._continue(taken, state, plan)
            span.set("epoch", outcome.epoch)
            span.set("outcome", outcome.result)
        return outcome

    def _take_over(self, state: RunState, workflow: Workflow, plan: ResumePlan, *, force: bool,
                   attributes: Mapping[str, str] | None) -> Any:
        """The run's lease at a new epoch (``LEASE_ACQUIRED`` with ``attributes``), seen accepted by
        the fold: the session, or the outcome when another writer holds or moved the run."""
        run_id = state.run_id
        try:
            session = self.runner.take_over(run_id, last_seq=state.last_seq, workflow=workflow,
                                            input_versions=state.input_versions, params=self._params(state),
                                            epoch=state.epoch, force=force,
                                            last_hash=state.last_hash, attributes=attributes,
                                            subject=state.subject)
        except LeaseHeld as err:
            return ResumeOutcome(run_id, "contended", plan, state.epoch, str(err))
        session.subject = state.subject  # its payloads are sealed for the subject it started with
        if state.parent_run_id is not None and state.parent_call:  # a child: its end wakes its parent
            session.parent = (state.parent_run_id, state.parent_call)
        confirmed, _ = self.reader.tail(run_id, state.partition, state.offset + 1, state)
        early = outcome_after_lease(confirmed, session.epoch, session.last_seq)
        if early is not None:
            session.close(release=True)
            epoch = state.epoch if early.result == "contended" else session.epoch  # contended: not ours
            return self._early(run_id, early, plan, epoch)
        if state.usage_budget is not None:  # the caps as raised; the spend the log records (each call once)
            session.budget = BudgetGuard(state.usage_budget, state.total_usage)
        return session

    def upgrade(self, state: RunState, workflow: Workflow, attributes: Mapping[str, str], *,
                stage: str | None, artifact_refs: tuple[ArtifactRef, ...],
                operator: Mapping[str, str]) -> ResumeOutcome:
        """Take the run's lease (``LEASE_ACQUIRED`` with ``operator``), append ``RUN_UPGRADED``
        (``workflow``'s spec, ``stage`` and ``artifact_refs`` of the checkpoint kept, ``attributes``:
        :func:`runlog.processors.upgrade.upgrade_attributes`), plan again from the upgraded state and go on
        on ``workflow``'s code (:mod:`runlog.processors.upgrade`). ``contended``: a writer holds the run,
        nothing was appended."""
        plan = ResumePlan(state.run_id, state.status.value, state.partition, 0, None)
        session = self._take_over(state, workflow, plan, force=False, attributes=operator)
        if isinstance(session, ResumeOutcome):
            return session
        try:
            session.append(EventType.RUN_UPGRADED, confirm=True, workflow=workflow.spec(), stage=stage,
                           artifact_refs=artifact_refs, attributes=dict(attributes))
            plan, upgraded = self.plan(state.run_id)
        except BaseException:
            session.close(release=True)
            raise
        return self._continue(session, upgraded, plan)

    def _continue(self, session: Any, state: RunState, plan: ResumePlan) -> ResumeOutcome:
        """Steps 6 and 7 under the lease (released at the end, whatever happens)."""
        run_id = state.run_id
        try:
            if plan.blocked_reason is not None:
                self._block(session, plan.blocked_reason)
                return ResumeOutcome(run_id, "blocked", plan, session.epoch, plan.blocked_reason)
            reconciled = self._reconcile(session, state, plan)
            if plan.blocked_reason is not None:
                self._block(session, plan.blocked_reason)
                return ResumeOutcome(run_id, "blocked", plan, session.epoch, plan.blocked_reason)
            w = state.waiting
            deadlines = {w.call_id: w.deadline_ms} if w else {}
            if w is not None and w.since_ms:  # a call's durable limit wait: it counts from then
                deadlines[limit_since_key(w.call_id)] = w.since_ms
            result = self.runner.execute(session, from_stage=plan.from_stage,
                                         stage_outputs=plan.stage_outputs,
                                         recorded_calls=plan.recorded, reconciled=reconciled,
                                         deadlines=deadlines)
        except ResumeBlocked as err:  # a call diverged, or an effect is in doubt in another run
            return ResumeOutcome(run_id, "blocked", plan, session.epoch, err.reason)
        except (VerificationFailed, ToolError, RunFailed, RunCancelled) as err:  # FAILED is on the log
            # RunFailed / RunCancelled: a child's outcome (ctx.start_child) the stage did not catch
            return ResumeOutcome(run_id, "failed", plan, session.epoch, str(err))
        except LeaseLost as err:
            return ResumeOutcome(run_id, "contended", plan, session.epoch, str(err))
        except (redis.RedisError, LogUnavailable, DeliveryError, LedgerUnavailable, ProjectionStoreError,
                ArtifactError):
            raise  # the services, not the run: the resumer service retries the resume later
        except Exception as err:  # noqa: BLE001 - the stage's own error (a bug in it): FAILED is on the log
            log.warning("resume %s: the stage raised %s: %s (recorded as FAILED)", run_id,
                        type(err).__name__, err)
            return ResumeOutcome(run_id, "failed", plan, session.epoch, f"{type(err).__name__}: {err}")
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
        if session.parent is not None:  # a child: its parent learns it is blocked (else the sweep tells it)
            with contextlib.suppress(RunlogError):
                self.runner.writer.request_resume(session.parent[0],
                                                  f"child {session.run_id} blocked ({session.parent[1]})")

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
                ref = self.artifacts.for_subject(state.subject).put(
                    json.dumps(doc, sort_keys=True).encode(), "application/json")
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
            sealed = self.artifacts.for_subject(state.subject)
            ref = sealed.put(json.dumps(dict(record), sort_keys=True).encode(), "application/json")
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


def describe(outcome: ResumeOutcome) -> dict[str, Any]:
    """An outcome as a JSON-ready dict."""
    return {"run_id": outcome.run_id, "result": outcome.result, "epoch": outcome.epoch,
            "detail": outcome.detail, "plan": outcome.plan.to_dict()}
