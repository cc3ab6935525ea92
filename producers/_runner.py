"""Starting runs and executing their stages (also for an existing run, which resume continues).

Event sequence of a run, all at the session's epoch (delivery: see
:mod:`producers._writer`)::

    RUN_STARTED (confirmed)          workflow spec, input_versions, params artifact
    per stage:
      STAGE_STARTED
      per tool call: TOOL_CALLED [EFFECT_INTENT (confirmed) ... EFFECT_RESULT] TOOL_RESULT
      VERIFIED (rules passed; output + artifacts)  |  FAILED (rules, stage error or tool error)
      (flush: everything so far acknowledged)
    RUN_COMPLETED (then flush, lease released)
    RUN_BLOCKED (confirmed)          instead, when a call diverged or an effect is in doubt

A run started with an idempotency key gets the run id the key names
(:func:`producers._runs.run_id_for_key`). Its start cannot strand, whatever the
crash point: the key is claimed ``pending``, the lease taken, ``RUN_STARTED``
appended and acknowledged, the claim marked ``started``. A caller that finds the
claim ``pending`` (its starter died) waits for the starter's lease to expire,
takes it, and asks the log: the run exists (a resume is requested) or it does
not (this caller appends ``RUN_STARTED`` at its own, higher epoch, reads the log
back to see it accepted, and executes the run).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio as aredis

from producers._active import ActiveRuns
from producers._artifacts import ArtifactStore, LocalArtifactStore
from producers._context import (
    JSON,
    AsyncStageContext,
    RecordedCall,
    RunWaits,
    StageContext,
    StageOutputs,
    error_info,
    require_mapping,
)
from producers._crash import crash_point, kill_self
from producers._inputs import DictInputSource, InputSource, PinnedInputs
from producers._keys import canonical_json, sha256_hex
from producers._lease import AsyncRedisLeaseManager, Lease, LeaseHeld, LeaseManager, RedisLeaseManager
from producers._ledger import EffectLedger, RedisEffectLedger
from producers._log import EventLog
from producers._protocol import (
    INLINE,
    IO,
    SYNC,
    Invoke,
    LoopMode,
    Mode,
    Sleep,
    Steps,
    ThreadMode,
    adrive,
    drive,
    is_async_fn,
)
from producers._runlog import KafkaRunLog, RunLog
from producers._runs import Claim, RunKeys, run_id_for_key
from producers._session import AppendResult, RunSession
from producers._trace import NO_TRACE, Span, Tracer
from producers._workflow import Stage, Workflow, evaluate_rules
from producers._writer import RunWriter
from schemas._hash import event_hash
from schemas._redis import aredis_client, redis_client
from schemas._types import ArtifactRef, ErrorInfo, EventType
from schemas.errors import (
    DeliveryError,
    LeaseLost,
    ResumeBlocked,
    RunlogError,
    VerificationFailed,
    WorkflowDefinitionError,
)
from schemas.settings import Settings

__all__ = ["STAGE_OUTPUT_MEDIA_TYPE", "AsyncRunner", "RunHandle", "RunResult", "Runner"]

STAGE_OUTPUT_MEDIA_TYPE = "application/vnd.runlog.stage-output+json"


@dataclass(frozen=True)
class RunHandle:
    """What :meth:`Runner.start_run` returns. ``session`` is None when the idempotency key
    named an existing run (``created`` False): this process does not own that run."""

    run_id: str
    created: bool
    params_hash: str
    session: RunSession | None = None


@dataclass(frozen=True)
class RunResult:
    """The end of :meth:`Runner.execute`: outputs of every verified stage by name."""

    run_id: str
    epoch: int
    last_seq: int
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    completed: bool = False
    waiting: str | None = None
    """The signal the run waits for (``ctx.wait_for``): the run was let go, a signal resumes it."""


class _RunnerCore:
    """The protocol of starting and executing runs, as steps (:mod:`producers._protocol`);
    :class:`Runner` drives them blocking, :class:`AsyncRunner` on an asyncio loop."""

    def __init__(self, writer: EventLog, leases: LeaseManager, store: ArtifactStore, *,
                 source: InputSource | None = None, run_keys: RunKeys | None = None,
                 max_parallel: int = 8, ledger: EffectLedger | None = None,
                 run_log: RunLog | None = None, lease_wait_s: float = 60.0,
                 active: ActiveRuns | None = None, tracer: Tracer = NO_TRACE) -> None:
        self.writer = writer
        self.leases = leases
        self.store = store
        self.source = source or DictInputSource({})
        self.run_keys = run_keys
        self.max_parallel = max_parallel
        self.ledger = ledger
        self.run_log = run_log
        self.lease_wait_s = lease_wait_s
        self.active = active
        self.tracer = tracer

    def _modes(self) -> tuple[Mode, Mode]:
        """The modes of a ``def`` stage's and an ``async def`` stage's context."""
        return SYNC, INLINE

    # -- starting ---------------------------------------------------------------------------

    def _start_steps(self, workflow: Workflow, params: Mapping[str, Any], inputs: Mapping[str, str] | None,
                     idempotency_key: str | None, parent_run_id: str | None,
                     forked_from_seq: int | None) -> Steps[RunHandle]:
        workflow.spec()  # refuses a workflow without stages before anything is claimed
        params_bytes = canonical_json(dict(params))
        params_hash = sha256_hex(params_bytes)
        pinned = PinnedInputs.pin(self.source, workflow.input_names(), inputs)
        wf_name = f"{workflow.name}@{workflow.version}"
        attrs = {"params_hash": params_hash, "writer": self.writer.writer_id}
        if idempotency_key is None:
            run_id = f"run-{uuid.uuid4().hex}"
        else:
            if self.run_keys is None:
                raise WorkflowDefinitionError("this Runner has no run key store for idempotency keys")
            run_id = run_id_for_key(idempotency_key)
            attrs["run_idempotency_key"] = idempotency_key
            _crash("before:CLAIM:run")
            claim: Claim = yield IO(self.run_keys, "claim", "aclaim",
                                    (idempotency_key, run_id, params_hash, wf_name))
            _crash("after:CLAIM:run")
            if not claim.created:
                if claim.started or claim.run_id != run_id:
                    return RunHandle(claim.run_id, False, params_hash)
                return (yield from self._settle_start(workflow, params_bytes, pinned, attrs, idempotency_key,
                                                      run_id, params_hash, wf_name, parent_run_id,
                                                      forked_from_seq))
        lease: Lease = yield IO(self.leases, "acquire", "aacquire", (run_id,))
        try:
            session = yield from self._append_start(lease, run_id, workflow, params_bytes, pinned, attrs,
                                                    parent_run_id, forked_from_seq)
        except BaseException:
            yield IO(lease, "release", "arelease")
            raise  # a keyed claim stays pending: the next caller settles it from the log
        if idempotency_key is not None and self.run_keys is not None:
            yield IO(self.run_keys, "mark_started", "amark_started",
                     (idempotency_key, run_id, params_hash, wf_name))
        return RunHandle(run_id, True, params_hash, session)

    def _activate(self, run_id: str, workflow: str) -> Steps[None]:
        if self.active is not None:
            try:
                yield IO(self.active, "add", "aadd", (run_id, workflow))
            except redis.RedisError as err:
                raise RunlogError(f"registering run {run_id!r} as active failed: {err}") from err

    def _deactivate(self, run_id: str) -> Steps[None]:
        if self.active is not None:
            with contextlib.suppress(redis.RedisError):  # a stale entry only costs a sweep's look
                yield IO(self.active, "remove", "aremove", (run_id,))

    def _append_start(self, lease: Lease, run_id: str, workflow: Workflow, params_bytes: bytes,
                      pinned: PinnedInputs, attrs: Mapping[str, str], parent_run_id: str | None,
                      forked_from_seq: int | None) -> Steps[RunSession]:
        session = RunSession(self.writer, lease, run_id=run_id, next_seq=1, workflow=workflow,
                             inputs=pinned, params=json.loads(params_bytes))
        params_ref = yield IO(self.store, "put", "aput", (params_bytes, JSON))
        yield session.appending(EventType.RUN_STARTED, confirm=True, workflow=workflow.spec(),
                                input_versions=pinned.versions, payload_ref=params_ref,
                                attributes=dict(attrs), parent_run_id=parent_run_id,
                                forked_from_seq=forked_from_seq)
        yield from self._activate(run_id, workflow.name)  # once the run exists: never a phantom
        return session

    def _acquire_waiting(self, run_id: str) -> Steps[Lease | None]:
        """The run's lease, waiting up to ``lease_wait_s`` for a dead holder's to expire."""
        deadline = time.monotonic() + self.lease_wait_s
        while True:
            try:
                lease: Lease = yield IO(self.leases, "acquire", "aacquire", (run_id,))
                return lease
            except LeaseHeld:
                if time.monotonic() >= deadline:
                    return None
            yield Sleep(0.1)

    def _settle_start(self, workflow: Workflow, params_bytes: bytes, pinned: PinnedInputs,
                      attrs: Mapping[str, str], key: str, run_id: str, params_hash: str, wf_name: str,
                      parent_run_id: str | None, forked_from_seq: int | None) -> Steps[RunHandle]:
        """A ``pending`` claim: its starter died somewhere between the claim and the claim's
        ``started`` mark. The log decides whether the run exists."""
        assert self.run_keys is not None
        if self.run_log is None:
            raise WorkflowDefinitionError("this Runner has no run log to settle an interrupted start")
        mark = IO(self.run_keys, "mark_started", "amark_started", (key, run_id, params_hash, wf_name))
        lease = yield from self._acquire_waiting(run_id)
        if lease is None:  # a live starter still holds it: that starter owns the run
            return RunHandle(run_id, False, params_hash)
        first = yield IO(self.run_log, "first_event", "afirst_event", (run_id,))
        if first is not None:
            yield IO(lease, "release", "arelease")
            yield mark
            yield IO(self.writer, "request_resume", "arequest_resume",
                     (run_id, "its start was interrupted after RUN_STARTED"))
            return RunHandle(run_id, False, params_hash)
        try:
            session = yield from self._append_start(lease, run_id, workflow, params_bytes, pinned, attrs,
                                                    parent_run_id, forked_from_seq)
        except BaseException:
            yield IO(lease, "release", "arelease")
            raise
        first = yield IO(self.run_log, "first_event", "afirst_event", (run_id,))
        if first is None or event_hash(first) != session.last_hash:
            # another writer's first event is on the log before ours: ours is rejected by the fold
            session.closed = True
            yield IO(lease, "release", "arelease")
            yield mark
            return RunHandle(run_id, False, params_hash)
        yield mark
        return RunHandle(run_id, True, params_hash, session)

    def _take_over_steps(self, run_id: str, *, last_seq: int, workflow: Workflow,
                         input_versions: Mapping[str, str], params: Mapping[str, Any], last_epoch: int,
                         force: bool, last_hash: str | None,
                         attributes: Mapping[str, str] | None) -> Steps[RunSession]:
        yield from self._activate(run_id, workflow.name)
        return (yield from RunSession.take_over_steps(
            self.writer, self.leases, run_id, last_seq=last_seq, workflow=workflow,
            input_versions=input_versions, source=self.source, params=params, last_epoch=last_epoch,
            force=force, last_hash=last_hash, attributes=attributes))

    # -- executing --------------------------------------------------------------------------

    def _execute_steps(self, session: RunSession, from_stage: str | None,
                       stage_outputs: Mapping[str, Mapping[str, Any] | ArtifactRef] | None,
                       recorded_calls: Mapping[str, RecordedCall | ArtifactRef] | None,
                       reconciled: Mapping[str, Mapping[str, Any]] | None, complete: bool, release: bool,
                       deadlines: Mapping[str, int] | None) -> Steps[RunResult]:
        wf = session.workflow
        outputs = StageOutputs(self.store, stage_outputs or {})
        names = [s.name for s in wf.stages]
        start = from_stage or next((n for n in names if n not in outputs), None)
        if start is not None and start not in names:
            raise WorkflowDefinitionError(f"workflow {wf.name!r} has no stage {start!r}")
        todo = wf.stages[names.index(start):] if start is not None else ()
        span = self.tracer.start("run", wf.name, None, {"run_id": session.run_id, "workflow": wf.name,
                                                         "epoch": session.epoch})
        outcome = "stopped"
        error: BaseException | None = None
        try:
            for stage in todo:
                outputs[stage.name] = yield from self._stage_steps(
                    session, stage, outputs, recorded_calls or {}, reconciled or {}, deadlines or {}, span)
            if complete:
                yield session.appending(EventType.RUN_COMPLETED)
            yield session.closing(release=release)
            if complete:
                yield from self._deactivate(session.run_id)
            outcome = "completed" if complete else "stopped"
        except LeaseLost as err:
            session.closed = True  # not ours any more: nothing to flush or release
            error = err
            raise
        except RunWaits as w:  # RUN_WAITING is acknowledged: let the run go until its signal
            yield session.closing(release=True)
            if self.active is not None:
                with contextlib.suppress(redis.RedisError):
                    yield IO(self.active, "wait", "await_", (session.run_id, wf.name, w.deadline_ms))
            outcome = "waiting"
            return RunResult(session.run_id, session.epoch, session.last_seq, outputs.as_dict(), False,
                             w.signal)
        except ResumeBlocked as err:
            outcome, error = "blocked", err
            with contextlib.suppress(RunlogError):
                yield session.appending(EventType.RUN_BLOCKED, confirm=True,
                                        error=ErrorInfo(type(err).__name__, err.reason, False))
                yield session.closing(release=release)
                yield from self._deactivate(session.run_id)
            raise
        except DeliveryError as err:
            error = err
            with contextlib.suppress(RunlogError):
                yield session.closing(release=release)
            raise  # the run is still RUNNING on the log: it stays active for the sweep
        except Exception as err:  # a stage failed: FAILED is on the log
            outcome, error = "failed", err
            with contextlib.suppress(RunlogError):
                yield session.closing(release=release)
                yield from self._deactivate(session.run_id)
            raise
        except BaseException as err:
            error = err
            with contextlib.suppress(RunlogError):
                yield session.closing(release=release)
            raise
        finally:
            span.set("seq", session.last_seq)
            span.set("outcome", outcome)
            span.end(error)
        return RunResult(session.run_id, session.epoch, session.last_seq, outputs.as_dict(), complete)

    def _stage_steps(self, s: RunSession, stage: Stage, outputs: StageOutputs,
                     recorded: Mapping[str, RecordedCall | ArtifactRef],
                     reconciled: Mapping[str, Mapping[str, Any]], deadlines: Mapping[str, int],
                     run_span: Span) -> Steps[dict[str, Any]]:
        started: AppendResult = yield s.appending(EventType.STAGE_STARTED, stage=stage.name)
        span = self.tracer.start("stage", stage.name, run_span, {
            "run_id": s.run_id, "stage": stage.name, "epoch": s.epoch, "seq": started.event.seq})
        try:
            out = yield from self._stage_body(s, stage, outputs, recorded, reconciled, deadlines, span)
        except RunWaits:
            span.set("outcome", "waiting")
            span.end()
            raise
        except BaseException as err:
            span.set("outcome", "blocked" if isinstance(err, ResumeBlocked) else "failed")
            span.end(err)
            raise
        span.set("outcome", "verified")
        span.end()
        return out

    def _stage_body(self, s: RunSession, stage: Stage, outputs: StageOutputs,
                    recorded: Mapping[str, RecordedCall | ArtifactRef],
                    reconciled: Mapping[str, Mapping[str, Any]], deadlines: Mapping[str, int],
                    span: Span) -> Steps[dict[str, Any]]:
        is_async = is_async_fn(stage.fn)
        sync_mode, async_mode = self._modes()
        kind = AsyncStageContext if is_async else StageContext
        ctx = kind(s, stage.name, self.store, outputs, recorded_calls=recorded, reconciled=reconciled,
                   max_parallel=self.max_parallel, ledger=self.ledger, deadlines=deadlines,
                   mode=async_mode if is_async else sync_mode, tracer=self.tracer, span=span)
        yield s.crashing(f"inside:STAGE:{stage.name}")
        try:
            inputs = s.inputs.load(stage.inputs)
            raw = yield Invoke(_run_async_stage if is_async else _run_sync_stage, (stage.fn, ctx, inputs))
            if ctx.failure is not None:
                raise ctx.failure  # the stage swallowed a failed tool call: it still failed
            out_bytes = canonical_json(require_mapping(stage.name, raw))
        except (LeaseLost, DeliveryError):
            raise
        except ResumeBlocked:
            if isinstance(ctx.failure, ResumeBlocked):
                raise ctx.failure from None
            raise
        except Exception as err:  # recorded as FAILED (unless a tool call already did), re-raised
            if isinstance(ctx.failure, ResumeBlocked):  # the stage swallowed it, then failed otherwise
                raise ctx.failure from err
            if ctx.failure is None:
                yield s.appending(EventType.FAILED, stage=stage.name, error=error_info(err))
            yield s.flushing()
            raise
        out: dict[str, Any] = json.loads(out_bytes)
        results = evaluate_rules(stage.rules, out)
        out_ref = yield from ctx._put(out_bytes, STAGE_OUTPUT_MEDIA_TYPE)
        refs = (*[a for a in ctx.artifacts if a.sha256 != out_ref.sha256], out_ref)
        failed = [r for r in results if not r.passed]
        if failed:
            msg = "; ".join(f"{r.rule}: {r.detail}" for r in failed)
            yield s.appending(EventType.FAILED, stage=stage.name, verification=tuple(results),
                              payload_ref=out_ref, artifact_refs=refs,
                              error=ErrorInfo("VerificationFailed", msg))
            yield s.flushing()
            raise VerificationFailed(stage.name, [r.rule for r in failed])
        yield s.appending(EventType.VERIFIED, stage=stage.name, verification=tuple(results),
                          payload_ref=out_ref, artifact_refs=refs)
        yield s.flushing()
        return out


def _crash(point: str) -> None:
    if crash_point(point):
        kill_self()


def _run_sync_stage(fn: Any, ctx: StageContext, inputs: Any) -> Any:
    try:
        return fn(ctx, inputs)
    finally:
        ctx.finish()


async def _run_async_stage(fn: Any, ctx: AsyncStageContext, inputs: Any) -> Any:
    try:
        return await fn(ctx, inputs)
    finally:
        await ctx.finish()


_START_DOC = """Pin inputs, take the lease and append a confirmed ``RUN_STARTED``.

        Args:
            params: the run's parameters (JSON object), stored as an artifact.
            inputs: explicit input versions; every other input a stage reads is
                pinned at its latest version.
            idempotency_key: names the run (its id is derived from the key); the same key
                with the same workflow and params returns the existing run
                (``created=False``, no session). See the module docstring for a start
                interrupted by a crash.

        Raises:
            RunConflict: the key names a run with other params or workflow.
            InputNotFound: an input or pinned version does not exist.
        """

_EXECUTE_DOC = """Execute the session's workflow from ``from_stage`` to the end.

        Args:
            session: a new run's session, or one from :meth:`take_over`.
            from_stage: the first stage to run (default: the first stage not in
                ``stage_outputs``).
            stage_outputs: outputs of already verified stages (dicts, or the
                ``payload_ref`` of their ``VERIFIED``), readable via ``ctx.output_of``.
            recorded_calls: the calls the log records for the stages to run (a
                :class:`RecordedCall`, or just the ``TOOL_RESULT`` payload_ref): a call
                with a recorded result is not made again and nothing is appended for
                it; any call at a recorded position must be the recorded call (the
                determinism guard, see :mod:`producers._context`).
            reconciled: ``call_id -> external record`` found by reconcile: not made
                again; one ``TOOL_RESULT`` (``source=reconciled``) is appended.
            complete: append ``RUN_COMPLETED`` after the last stage.
            release: release the lease at the end (also after a failed stage).
            deadlines: ``call_id -> deadline (ms)`` of the run's waits (``RunState.waiting``), so a
                resumed wait keeps its first deadline.

        Raises:
            VerificationFailed, ToolError, or the stage's own exception, after ``FAILED``
            was appended and flushed; ResumeBlocked (Diverged, EffectInDoubt) after
            ``RUN_BLOCKED`` was appended; LeaseLost / DeliveryError without appending.
        """


class Runner(_RunnerCore):
    """Starts runs and executes stages, blocking the caller; thread-safe, one per process is enough.

    ``def`` stages run on the calling thread (``ctx.submit`` / ``ctx.parallel`` on a thread pool);
    an ``async def`` stage runs on a private event loop for its duration.

    Args:
        writer: the shared producer.
        leases: where leases come from (Redis in production).
        store: the artifact store.
        source: where versioned inputs come from (empty when None).
        run_keys: the run idempotency-key store (required to pass ``idempotency_key``).
        max_parallel: threads per stage for ``ctx.submit`` / ``ctx.parallel``.
        ledger: the effects ledger shared by all runs (consulted before every effect).
        run_log: reads a run's first event back (settles interrupted keyed starts).
        lease_wait_s: how long a keyed start waits for a crashed starter's lease to expire.
        active: the registry of active runs the resumers' sweep reads (no projector needed).
        tracer: spans per run, stage and call (``producers.otel.OtelTracer``; none by default).
    """

    def __init__(self, writer: EventLog, leases: LeaseManager, store: ArtifactStore, *,
                 source: InputSource | None = None, run_keys: RunKeys | None = None,
                 max_parallel: int = 8, ledger: EffectLedger | None = None,
                 run_log: RunLog | None = None, lease_wait_s: float = 60.0,
                 active: ActiveRuns | None = None, tracer: Tracer = NO_TRACE) -> None:
        super().__init__(writer, leases, store, source=source, run_keys=run_keys, max_parallel=max_parallel,
                         ledger=ledger, run_log=run_log, lease_wait_s=lease_wait_s, active=active,
                         tracer=tracer)
        self._owned: list[Any] = []

    @classmethod
    def from_settings(cls, settings: Settings, *, source: InputSource | None = None,
                      writer: EventLog | None = None, store: ArtifactStore | None = None,
                      tracer: Tracer = NO_TRACE, metrics_registry: Any = None) -> Runner:
        """A runner on the real services: Redis leases and run keys, the local artifact store.
        ``metrics_registry``: a ``prometheus_client.CollectorRegistry`` its own writer counts into."""
        # Blocking pool: many run threads share a bounded set of connections and wait for one.
        client = redis_client(settings, max_connections=64, timeout=30)
        own_writer = writer is None
        w = writer or RunWriter(settings, metrics_registry=metrics_registry)
        leases = RedisLeaseManager(client, settings, holder=w.writer_id)
        r = cls(w, leases, store or LocalArtifactStore(settings.artifact_root), source=source,
                run_keys=RunKeys(client, settings.redis_prefix),
                ledger=RedisEffectLedger(client, settings.redis_prefix), run_log=KafkaRunLog(settings),
                lease_wait_s=settings.lease_ttl_ms / 1000 + 5,
                active=ActiveRuns(client, settings.redis_prefix), tracer=tracer)
        r._owned = [leases, client] + ([w] if own_writer else [])
        return r

    def close(self) -> None:
        """Close what :meth:`from_settings` created (flushes the writer)."""
        for x in reversed(self._owned):
            x.close()
        self._owned = []

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start_run(self, workflow: Workflow, params: Mapping[str, Any],
                  inputs: Mapping[str, str] | None = None, idempotency_key: str | None = None, *,
                  parent_run_id: str | None = None, forked_from_seq: int | None = None) -> RunHandle:
        return drive(self._start_steps(workflow, params, inputs, idempotency_key, parent_run_id,
                                       forked_from_seq))

    start_run.__doc__ = _START_DOC

    def mark_inactive(self, run_id: str) -> None:
        """Drop a run from the active-runs registry (it completed, blocked or failed)."""
        drive(self._deactivate(run_id))

    def run(self, workflow: Workflow, params: Mapping[str, Any], inputs: Mapping[str, str] | None = None,
            idempotency_key: str | None = None) -> RunResult:
        """Start a run and execute all its stages. For a key naming an existing run,
        returns at once with ``completed=False`` and no outputs (resume owns that run)."""
        h = self.start_run(workflow, params, inputs, idempotency_key)
        if h.session is None:
            return RunResult(h.run_id, 0, 0)
        return self.execute(h.session)

    def take_over(self, run_id: str, *, last_seq: int, workflow: Workflow,
                  input_versions: Mapping[str, str], params: Mapping[str, Any], last_epoch: int = 0,
                  force: bool = False, last_hash: str | None = None,
                  attributes: Mapping[str, str] | None = None) -> RunSession:
        """:meth:`RunSession.take_over` with this runner's writer, leases and input source."""
        return drive(self._take_over_steps(run_id, last_seq=last_seq, workflow=workflow,
                                           input_versions=input_versions, params=params,
                                           last_epoch=last_epoch, force=force, last_hash=last_hash,
                                           attributes=attributes))

    def execute(self, session: RunSession, *, from_stage: str | None = None,
                stage_outputs: Mapping[str, Mapping[str, Any] | ArtifactRef] | None = None,
                recorded_calls: Mapping[str, RecordedCall | ArtifactRef] | None = None,
                reconciled: Mapping[str, Mapping[str, Any]] | None = None,
                complete: bool = True, release: bool = True,
                deadlines: Mapping[str, int] | None = None) -> RunResult:
        return drive(self._execute_steps(session, from_stage, stage_outputs, recorded_calls, reconciled,
                                         complete, release, deadlines))

    execute.__doc__ = _EXECUTE_DOC


class AsyncRunner(_RunnerCore):
    """The asyncio form of :class:`Runner`: the same protocol steps, awaited on the running loop.

    Thousands of runs share one loop and one writer: confirmed appends are awaited (the writer's
    poll thread sends them at once and completes their futures), Redis round trips use redis-py's
    asyncio client; lease heartbeats are one thread with its own connection (a loop busy with
    thousands of runs must not delay them). ``async def`` stages and tools run
    on the loop; a ``def`` stage runs on a worker thread (its ``ctx.call`` hops onto the loop for
    every append and round trip), a ``def`` tool in an ``async def`` stage on ``executor``.

    Args:
        like :class:`Runner`, plus
        executor: the pool for ``def`` stages and tools (default: one of ``max_threads`` threads).
    """

    def __init__(self, writer: EventLog, leases: LeaseManager, store: ArtifactStore, *,
                 source: InputSource | None = None, run_keys: RunKeys | None = None,
                 max_parallel: int = 8, ledger: EffectLedger | None = None,
                 run_log: RunLog | None = None, lease_wait_s: float = 60.0,
                 active: ActiveRuns | None = None, tracer: Tracer = NO_TRACE,
                 executor: Executor | None = None, max_threads: int = 32) -> None:
        super().__init__(writer, leases, store, source=source, run_keys=run_keys, max_parallel=max_parallel,
                         ledger=ledger, run_log=run_log, lease_wait_s=lease_wait_s, active=active,
                         tracer=tracer)
        self._own_executor = executor is None
        self.executor = executor or ThreadPoolExecutor(max_threads, thread_name_prefix="runlog-async")
        self._loop_mode = LoopMode(self.executor)
        self._owned: list[Any] = []

    def _modes(self) -> tuple[Mode, Mode]:
        return ThreadMode(asyncio.get_running_loop()), self._loop_mode

    @classmethod
    def from_settings(cls, settings: Settings, *, source: InputSource | None = None,
                      writer: EventLog | None = None, store: ArtifactStore | None = None,
                      tracer: Tracer = NO_TRACE, max_connections: int = 256,
                      pool_timeout: float | None = None, metrics_registry: Any = None) -> AsyncRunner:
        """An async runner on the real services (Redis via redis-py's asyncio client).

        ``max_connections``: the asyncio pool the runs share; a run waits for a free connection up
        to ``pool_timeout`` seconds (None, the default: as long as it takes, since waiting there
        is queueing behind other runs, not a failure; a Redis that stops answering is bounded by
        the URL's ``socket_timeout``, as for every other client). ``metrics_registry``: a
        ``prometheus_client.CollectorRegistry`` its own writer counts into."""
        client = redis_client(settings, max_connections=16, timeout=30)
        aclient = aredis_client(settings, max_connections=max_connections, timeout=pool_timeout)
        beat = redis_client(settings, max_connections=2, timeout=30)  # the heartbeat thread's own
        own_writer = writer is None
        w = writer or RunWriter(settings, metrics_registry=metrics_registry)
        leases = AsyncRedisLeaseManager(client, aclient, settings, holder=w.writer_id, heartbeat_client=beat)
        r = cls(w, leases, store or LocalArtifactStore(settings.artifact_root), source=source,
                run_keys=RunKeys(client, settings.redis_prefix, aclient=aclient),
                ledger=RedisEffectLedger(client, settings.redis_prefix, aclient=aclient),
                run_log=KafkaRunLog(settings), lease_wait_s=settings.lease_ttl_ms / 1000 + 5,
                active=ActiveRuns(client, settings.redis_prefix, aclient=aclient), tracer=tracer)
        r._owned = [beat, leases, client, aclient] + ([w] if own_writer else [])
        return r

    async def aclose(self) -> None:
        """Close what :meth:`from_settings` created (flushes the writer off the loop)."""
        for x in reversed(self._owned):
            if isinstance(x, LeaseManager):
                await x.aclose()
            elif isinstance(x, aredis.Redis):
                await x.aclose(close_connection_pool=True)
            elif isinstance(x, aredis.RedisCluster):
                await x.aclose()
            elif isinstance(x, EventLog):
                await asyncio.to_thread(x.close)
            else:
                x.close()
        self._owned = []
        if self._own_executor:
            self.executor.shutdown(wait=False)

    async def __aenter__(self) -> AsyncRunner:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start_run(self, workflow: Workflow, params: Mapping[str, Any],
                        inputs: Mapping[str, str] | None = None, idempotency_key: str | None = None, *,
                        parent_run_id: str | None = None, forked_from_seq: int | None = None) -> RunHandle:
        return await adrive(self._start_steps(workflow, params, inputs, idempotency_key, parent_run_id,
                                              forked_from_seq), self._loop_mode)

    start_run.__doc__ = _START_DOC

    async def mark_inactive(self, run_id: str) -> None:
        """Drop a run from the active-runs registry (it completed, blocked or failed)."""
        await adrive(self._deactivate(run_id), self._loop_mode)

    async def run(self, workflow: Workflow, params: Mapping[str, Any],
                  inputs: Mapping[str, str] | None = None, idempotency_key: str | None = None) -> RunResult:
        """Start a run and execute all its stages (see :meth:`Runner.run`)."""
        h = await self.start_run(workflow, params, inputs, idempotency_key)
        if h.session is None:
            return RunResult(h.run_id, 0, 0)
        return await self.execute(h.session)

    async def take_over(self, run_id: str, *, last_seq: int, workflow: Workflow,
                        input_versions: Mapping[str, str], params: Mapping[str, Any], last_epoch: int = 0,
                        force: bool = False, last_hash: str | None = None,
                        attributes: Mapping[str, str] | None = None) -> RunSession:
        """:meth:`Runner.take_over`, awaited."""
        return await adrive(self._take_over_steps(run_id, last_seq=last_seq, workflow=workflow,
                                                  input_versions=input_versions, params=params,
                                                  last_epoch=last_epoch, force=force, last_hash=last_hash,
                                                  attributes=attributes), self._loop_mode)

    async def execute(self, session: RunSession, *, from_stage: str | None = None,
                      stage_outputs: Mapping[str, Mapping[str, Any] | ArtifactRef] | None = None,
                      recorded_calls: Mapping[str, RecordedCall | ArtifactRef] | None = None,
                      reconciled: Mapping[str, Mapping[str, Any]] | None = None,
                      complete: bool = True, release: bool = True,
                      deadlines: Mapping[str, int] | None = None) -> RunResult:
        return await adrive(self._execute_steps(session, from_stage, stage_outputs, recorded_calls,
                                                reconciled, complete, release, deadlines), self._loop_mode)

    execute.__doc__ = _EXECUTE_DOC
