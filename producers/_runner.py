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
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from producers._artifacts import ArtifactStore, LocalArtifactStore
from producers._context import JSON, StageContext, StageOutputs, error_info, require_mapping
from producers._inputs import DictInputSource, InputSource, PinnedInputs
from producers._keys import canonical_json, sha256_hex
from producers._lease import LeaseManager, RedisLeaseManager
from producers._runs import RunKeys
from producers._session import RunSession
from producers._workflow import Stage, Workflow, evaluate_rules
from producers._writer import RunWriter
from schemas._types import ArtifactRef, ErrorInfo, EventType
from schemas.errors import DeliveryError, LeaseLost, RunlogError, VerificationFailed, WorkflowDefinitionError
from schemas.settings import Settings

__all__ = ["STAGE_OUTPUT_MEDIA_TYPE", "RunHandle", "RunResult", "Runner"]

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


class Runner:
    """Starts runs and executes stages; thread-safe, one per process is enough.

    Args:
        writer: the shared producer.
        leases: where leases come from (Redis in production).
        store: the artifact store.
        source: where versioned inputs come from (empty when None).
        run_keys: the run idempotency-key store (required to pass ``idempotency_key``).
        max_parallel: threads per stage for ``ctx.submit`` / ``ctx.parallel``.
    """

    def __init__(self, writer: RunWriter, leases: LeaseManager, store: ArtifactStore, *,
                 source: InputSource | None = None, run_keys: RunKeys | None = None,
                 max_parallel: int = 8) -> None:
        self.writer = writer
        self.leases = leases
        self.store = store
        self.source = source or DictInputSource({})
        self.run_keys = run_keys
        self.max_parallel = max_parallel
        self._owned: list[Any] = []

    @classmethod
    def from_settings(cls, settings: Settings, *, source: InputSource | None = None,
                      writer: RunWriter | None = None, store: ArtifactStore | None = None) -> Runner:
        """A runner on the real services: Redis leases and run keys, the local artifact store."""
        # Blocking pool: many run threads share a bounded set of connections and wait for one.
        pool = redis.BlockingConnectionPool.from_url(settings.redis_url, max_connections=64, timeout=30,
                                                     **settings.redis_kwargs())
        client = redis.Redis(connection_pool=pool)
        own_writer = writer is None
        w = writer or RunWriter(settings)
        leases = RedisLeaseManager(client, settings, holder=w.writer_id)
        r = cls(w, leases, store or LocalArtifactStore(settings.artifact_root), source=source,
                run_keys=RunKeys(client, settings.redis_prefix))
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

    # -- starting ---------------------------------------------------------------------------

    def start_run(self, workflow: Workflow, params: Mapping[str, Any],
                  inputs: Mapping[str, str] | None = None, idempotency_key: str | None = None, *,
                  parent_run_id: str | None = None, forked_from_seq: int | None = None) -> RunHandle:
        """Pin inputs, take the lease (epoch 1) and append a confirmed ``RUN_STARTED``.

        Args:
            params: the run's parameters (JSON object), stored as an artifact.
            inputs: explicit input versions; every other input a stage reads is
                pinned at its latest version.
            idempotency_key: the same key with the same workflow and params returns
                the existing run (``created=False``, no session).

        Raises:
            RunConflict: the key names a run with other params or workflow.
            InputNotFound: an input or pinned version does not exist.
        """
        spec = workflow.spec()
        params_bytes = canonical_json(dict(params))
        params_hash = sha256_hex(params_bytes)
        pinned = PinnedInputs.pin(self.source, workflow.input_names(), inputs)
        run_id = f"run-{uuid.uuid4().hex}"
        wf_name = f"{workflow.name}@{workflow.version}"
        if idempotency_key is not None:
            if self.run_keys is None:
                raise WorkflowDefinitionError("this Runner has no run key store for idempotency keys")
            existing = self.run_keys.claim(idempotency_key, run_id, params_hash, wf_name)
            if existing is not None:
                return RunHandle(existing, False, params_hash)
        attrs = {"params_hash": params_hash, "writer": self.writer.writer_id}
        if idempotency_key is not None:
            attrs["run_idempotency_key"] = idempotency_key
        lease = None
        try:
            lease = self.leases.acquire(run_id)
            session = RunSession(self.writer, lease, run_id=run_id, next_seq=1, workflow=workflow,
                                 inputs=pinned, params=json.loads(params_bytes))
            params_ref = self.store.put(params_bytes, JSON)
            session.append(EventType.RUN_STARTED, confirm=True, workflow=spec,
                           input_versions=pinned.versions, payload_ref=params_ref, attributes=attrs,
                           parent_run_id=parent_run_id, forked_from_seq=forked_from_seq)
        except BaseException:
            if lease is not None:
                lease.release()
            if idempotency_key is not None and self.run_keys is not None:
                with contextlib.suppress(redis.RedisError):
                    self.run_keys.unclaim(idempotency_key, run_id, params_hash, wf_name)
            raise
        return RunHandle(run_id, True, params_hash, session)

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
                  force: bool = False, last_hash: str | None = None) -> RunSession:
        """:meth:`RunSession.take_over` with this runner's writer, leases and input source."""
        return RunSession.take_over(self.writer, self.leases, run_id, last_seq=last_seq, workflow=workflow,
                                    input_versions=input_versions, source=self.source, params=params,
                                    last_epoch=last_epoch, force=force, last_hash=last_hash)

    # -- executing --------------------------------------------------------------------------

    def execute(self, session: RunSession, *, from_stage: str | None = None,
                stage_outputs: Mapping[str, Mapping[str, Any] | ArtifactRef] | None = None,
                recorded_calls: Mapping[str, ArtifactRef] | None = None,
                reconciled: Mapping[str, Mapping[str, Any]] | None = None,
                complete: bool = True, release: bool = True) -> RunResult:
        """Execute the session's workflow from ``from_stage`` to the end.

        Args:
            session: a new run's session, or one from :meth:`RunSession.take_over`.
            from_stage: the first stage to run (default: the first stage not in
                ``stage_outputs``).
            stage_outputs: outputs of already verified stages (dicts, or the
                ``payload_ref`` of their ``VERIFIED``), readable via ``ctx.output_of``.
            recorded_calls: ``call_id -> TOOL_RESULT payload_ref``: these calls are
                not made again and nothing is appended for them.
            reconciled: ``call_id -> external record`` found by reconcile: not made
                again; one ``TOOL_RESULT`` (``source=reconciled``) is appended.
            complete: append ``RUN_COMPLETED`` after the last stage.
            release: release the lease at the end (also after a failed stage).

        Raises:
            VerificationFailed, ToolError, or the stage's own exception, after ``FAILED``
            was appended and flushed; LeaseLost / DeliveryError without appending.
        """
        wf = session.workflow
        outputs = StageOutputs(self.store, stage_outputs or {})
        names = [s.name for s in wf.stages]
        start = from_stage or next((n for n in names if n not in outputs), None)
        if start is not None and start not in names:
            raise WorkflowDefinitionError(f"workflow {wf.name!r} has no stage {start!r}")
        todo = wf.stages[names.index(start):] if start is not None else ()
        try:
            for stage in todo:
                outputs[stage.name] = self._run_stage(session, stage, outputs, recorded_calls or {},
                                                      reconciled or {})
            if complete:
                session.append(EventType.RUN_COMPLETED)
            session.close(release=release)
        except LeaseLost:
            session.closed = True  # not ours any more: nothing to flush or release
            raise
        except BaseException:
            with contextlib.suppress(RunlogError):
                session.close(release=release)
            raise
        return RunResult(session.run_id, session.epoch, session.last_seq, outputs.as_dict(), complete)

    def _run_stage(self, s: RunSession, stage: Stage, outputs: StageOutputs,
                   recorded: Mapping[str, ArtifactRef], reconciled: Mapping[str, Mapping[str, Any]]
                   ) -> dict[str, Any]:
        ctx = StageContext(s, stage.name, self.store, outputs, recorded_calls=recorded,
                           reconciled=reconciled, max_parallel=self.max_parallel)
        s.append(EventType.STAGE_STARTED, stage=stage.name)
        s.crash_point(f"inside:STAGE:{stage.name}")
        try:
            try:
                raw = stage.fn(ctx, s.inputs.load(stage.inputs))
            finally:
                ctx.finish()
            if ctx.failure is not None:
                raise ctx.failure  # the stage swallowed a failed tool call: it still failed
            out_bytes = canonical_json(require_mapping(stage.name, raw))
        except (LeaseLost, DeliveryError):
            raise
        except Exception as err:  # recorded as FAILED (unless a tool call already did), re-raised
            if ctx.failure is None:
                s.append(EventType.FAILED, stage=stage.name, error=error_info(err))
            s.flush()
            raise
        out: dict[str, Any] = json.loads(out_bytes)
        results = evaluate_rules(stage.rules, out)
        out_ref = ctx.put_artifact(out_bytes, STAGE_OUTPUT_MEDIA_TYPE)
        refs = (*[a for a in ctx.artifacts if a.sha256 != out_ref.sha256], out_ref)
        failed = [r for r in results if not r.passed]
        if failed:
            msg = "; ".join(f"{r.rule}: {r.detail}" for r in failed)
            s.append(EventType.FAILED, stage=stage.name, verification=tuple(results), payload_ref=out_ref,
                     artifact_refs=refs, error=ErrorInfo("VerificationFailed", msg))
            s.flush()
            raise VerificationFailed(stage.name, [r.rule for r in failed])
        s.append(EventType.VERIFIED, stage=stage.name, verification=tuple(results), payload_ref=out_ref,
                 artifact_refs=refs)
        s.flush()
        return out
