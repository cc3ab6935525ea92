"""Starting a run, as protocol steps both runners drive: the lease, a confirmed ``RUN_STARTED``,
and the idempotency key's claim.

A run started with an idempotency key gets the run id the key names
(:func:`runlog.producers.run._runs.run_id_for_key`). Its start cannot strand, whatever the
crash point: the key is claimed ``pending``, the lease taken, ``RUN_STARTED``
appended and acknowledged, the claim marked ``started``. A caller that finds the
claim ``pending`` (its starter died) waits for the starter's lease to expire,
takes it, and asks the log: the run exists (a resume is requested) or it does
not (this caller appends ``RUN_STARTED`` at its own, higher epoch, reads the log
back to see it accepted, and executes the run).
"""


from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Mapping
from typing import Any

import redis

from runlog.producers.base._protocol import (
    Sleep,
    Steps,
    io,
)
from runlog.producers.base._trace import Tracer, context_of
from runlog.producers.calls._artifacts import ArtifactStore
from runlog.producers.calls._call_budget import BudgetGuard
from runlog.producers.calls._calls import JSON
from runlog.producers.calls._keys import canonical_json
from runlog.producers.crash import crash_point, kill_self
from runlog.producers.define._budget import Budget
from runlog.producers.define._inputs import InputSource, PinnedInputs
from runlog.producers.define._workflow import Workflow
from runlog.producers.log._lease import Lease, LeaseHeld, LeaseManager
from runlog.producers.log._log import EventLog
from runlog.producers.log._runlog import RunLog
from runlog.producers.log._session import RunSession
from runlog.producers.run._active import ActiveRuns
from runlog.producers.run._results import RunHandle
from runlog.producers.run._runs import Claim, RunKeyStore, run_id_for_key
from runlog.projections.internal import BUDGET_ATTRIBUTE
from runlog.schemas import EventType, event_hash
from runlog.schemas.errors import (
    RunlogError,
    WorkflowDefinitionError,
)
from runlog.schemas.internal import PARENT_CALL_ATTRIBUTE, STAGES_ATTRIBUTE, SUBJECT_ATTRIBUTE

__all__ = ["RunHandle", "RunStarts", "activating", "deactivating"]


class RunStarts:
    """Starting a run and taking one over, as steps (a runner's start procedure).

    Args:
        writer: the shared producer.
        leases: where leases come from.
        store: the artifact store (parameters too large to travel inline).
        source: where versioned inputs come from.
        run_keys: the run idempotency-key store (required to start with an idempotency key).
        run_log: reads a run's first event back (settles interrupted keyed starts).
        lease_wait_s: how long a keyed start waits for a crashed starter's lease to expire.
        active: the registry of active runs (a started or taken-over run is added).
        tracer: opens the run span of a start.
    """

    def __init__(self, writer: EventLog, leases: LeaseManager, store: ArtifactStore, source: InputSource, *,
                 run_keys: RunKeyStore | None, run_log: RunLog | None, lease_wait_s: float,
                 active: ActiveRuns | None, tracer: Tracer) -> None:
        self.writer = writer
        self.leases = leases
        self.store = store
        self.source = source
        self.run_keys = run_keys
        self.run_log = run_log
        self.lease_wait_s = lease_wait_s
        self.active = active
        self.tracer = tracer

    def start(self, workflow: Workflow, params: Mapping[str, Any], inputs: Mapping[str, str] | None,
                     idempotency_key: str | None, parent_run_id: str | None,
                     forked_from_seq: int | None, budget: Budget | None = None,
                     attributes: Mapping[str, str] | None = None,
                     subject: str | None = None) -> Steps[RunHandle]:
        workflow.spec()  # refuses a workflow without stages before anything is claimed
        if subject is not None and (not isinstance(subject, str) or not subject.strip()):
            raise WorkflowDefinitionError(f"a run's subject must be a non-empty string, got {subject!r}")
        store = self.store.for_subject(subject)
        params_bytes = canonical_json(dict(params))
        params_hash = store.digest(params_bytes)
        pinned = PinnedInputs.pin(self.source, workflow.input_names(), inputs)
        wf_name = f"{workflow.name}@{workflow.version}"
        attrs = {**(attributes or {}), "params_hash": params_hash, "writer": self.writer.writer_id}
        sealed_for = store.subject or subject  # the default subject too, where payloads are sealed
        if sealed_for is not None:  # `runlog erase` and the audit find a subject's runs by this attribute
            attrs[SUBJECT_ATTRIBUTE] = sealed_for
        if idempotency_key is None:
            run_id = f"run-{uuid.uuid4().hex}"
        else:
            if self.run_keys is None:
                raise WorkflowDefinitionError("this Runner has no run key store for idempotency keys")
            run_id = run_id_for_key(idempotency_key)
            attrs["run_idempotency_key"] = idempotency_key
            _crash("before:CLAIM:run")
            claim: Claim = yield from io(self.run_keys.claim, self.run_keys.aclaim, idempotency_key, run_id,
                                         params_hash, wf_name)
            _crash("after:CLAIM:run")
            if not claim.created:
                if claim.started or claim.run_id != run_id:
                    return RunHandle(claim.run_id, False, params_hash)
                return (yield from self._settle_start(workflow, params_bytes, pinned, attrs, idempotency_key,
                                                      run_id, params_hash, wf_name, parent_run_id,
                                                      forked_from_seq, budget))
            if (yield from self._existed(run_id)):
                # the claim was lost with Redis's data, not the run: settle the key, resume the run
                yield from io(self.run_keys.mark_started, self.run_keys.amark_started, idempotency_key,
                              run_id, params_hash, wf_name)
                yield from io(self.writer.request_resume, self.writer.arequest_resume, run_id,
                              "a keyed start found the run on the log (its claim was lost)")
                return RunHandle(run_id, False, params_hash)
        lease: Lease = yield from io(self.leases.acquire, self.leases.aacquire, run_id)
        try:
            session = yield from self._append_start(lease, run_id, workflow, params_bytes, pinned, attrs,
                                                    parent_run_id, forked_from_seq, budget)
        except BaseException:
            yield from io(lease.release, lease.arelease)
            raise  # a keyed claim stays pending: the next caller settles it from the log
        if idempotency_key is not None and self.run_keys is not None:
            yield from io(self.run_keys.mark_started, self.run_keys.amark_started, idempotency_key, run_id,
                          params_hash, wf_name)
        return RunHandle(run_id, True, params_hash, session)

    def _existed(self, run_id: str) -> Steps[bool]:
        """Whether a keyed run whose claim this call just made is already on the log: the
        projection says so cheaply; without a ready one, the log is read (see
        :mod:`runlog.producers.run._runs`)."""
        assert self.run_keys is not None
        known = yield from io(self.run_keys.known, self.run_keys.aknown, run_id)
        if known is not None or self.run_log is None:
            return bool(known)
        first = yield from io(self.run_log.first_event, self.run_log.afirst_event, run_id)
        return first is not None

    def _append_start(self, lease: Lease, run_id: str, workflow: Workflow, params_bytes: bytes,
                      pinned: PinnedInputs, attrs: Mapping[str, str], parent_run_id: str | None,
                      forked_from_seq: int | None, budget: Budget | None = None) -> Steps[RunSession]:
        session = RunSession(self.writer, lease, run_id=run_id, next_seq=1, workflow=workflow,
                             inputs=pinned, params=json.loads(params_bytes))
        session.subject = attrs.get(SUBJECT_ATTRIBUTE)
        parent_call = attrs.get(PARENT_CALL_ATTRIBUTE)
        if parent_run_id is not None and parent_call:
            session.parent = (parent_run_id, parent_call)
        store = self.store.for_subject(session.subject)
        chosen = budget or workflow.budget
        caps = chosen.caps() if chosen is not None else None
        if caps is not None:
            session.budget = BudgetGuard(caps)
            attrs = {**attrs, BUDGET_ATTRIBUTE: caps.to_json()}
        # the run span opens before RUN_STARTED, which records its context (the run's trace, which a
        # resume elsewhere continues); the execution that follows takes it over
        span = session.run_span = self.tracer.start("run", workflow.name, None, {
            "run_id": run_id, "workflow": workflow.name, "epoch": lease.epoch})
        session.trace = context_of(span) or session.trace
        try:
            params_ref = store.inline(params_bytes, JSON)  # small parameters travel in RUN_STARTED
            if params_ref is None:
                params_ref = yield from io(store.put, store.aput, params_bytes, JSON)
            attributes = {**attrs, STAGES_ATTRIBUTE: json.dumps(workflow.fingerprints(), sort_keys=True,
                                                                separators=(",", ":")),
                          **(session.trace.attributes() if session.trace is not None else {})}
            yield from session.appending(EventType.RUN_STARTED, confirm=True, workflow=workflow.spec(),
                                         input_versions=pinned.versions, payload_ref=params_ref,
                                         attributes=attributes, parent_run_id=parent_run_id,
                                         forked_from_seq=forked_from_seq)
            yield from activating(self.active, run_id, workflow.name)  # once the run exists: never a phantom
        except BaseException as err:
            session.run_span = None
            span.set("outcome", "stopped")
            span.end(err)
            raise
        return session

    def _acquire_waiting(self, run_id: str) -> Steps[Lease | None]:
        """The run's lease, waiting up to ``lease_wait_s`` for a dead holder's to expire."""
        deadline = time.monotonic() + self.lease_wait_s
        while True:
            try:
                lease: Lease = yield from io(self.leases.acquire, self.leases.aacquire, run_id)
                return lease
            except LeaseHeld:
                if time.monotonic() >= deadline:
                    return None
            yield from Sleep(0.1)

    def _settle_start(self, workflow: Workflow, params_bytes: bytes, pinned: PinnedInputs,
                      attrs: Mapping[str, str], key: str, run_id: str, params_hash: str, wf_name: str,
                      parent_run_id: str | None, forked_from_seq: int | None,
                      budget: Budget | None = None) -> Steps[RunHandle]:
        """A ``pending`` claim: its starter died somewhere between the claim and the claim's
        ``started`` mark. The log decides whether the run exists."""
        assert self.run_keys is not None
        if self.run_log is None:
            raise WorkflowDefinitionError("this Runner has no run log to settle an interrupted start")
        mark = io(self.run_keys.mark_started, self.run_keys.amark_started, key, run_id, params_hash, wf_name)
        lease = yield from self._acquire_waiting(run_id)
        if lease is None:  # a live starter still holds it: that starter owns the run
            return RunHandle(run_id, False, params_hash)
        first = yield from io(self.run_log.first_event, self.run_log.afirst_event, run_id)
        if first is not None:
            yield from io(lease.release, lease.arelease)
            yield from mark
            yield from io(self.writer.request_resume, self.writer.arequest_resume, run_id,
                          "its start was interrupted after RUN_STARTED")
            return RunHandle(run_id, False, params_hash)
        try:
            session = yield from self._append_start(lease, run_id, workflow, params_bytes, pinned, attrs,
                                                    parent_run_id, forked_from_seq, budget)
        except BaseException:
            yield from io(lease.release, lease.arelease)
            raise
        first = yield from io(self.run_log.first_event, self.run_log.afirst_event, run_id)
        # event_hash(first) encodes a version-2 event with the current schema: the question is only
        # whether the log's first event is the one this writer (this code, this schema) just produced
        if first is None or event_hash(first) != session.last_hash:
            # another writer's first event is on the log before ours: ours is rejected by the fold
            session.end_run_span()
            session.closed = True
            yield from io(lease.release, lease.arelease)
            yield from mark
            return RunHandle(run_id, False, params_hash)
        yield from mark
        return RunHandle(run_id, True, params_hash, session)

    def take_over(self, run_id: str, *, last_seq: int, workflow: Workflow,
                  input_versions: Mapping[str, str], params: Mapping[str, Any], epoch: int,
                  force: bool, last_hash: str | None,
                  attributes: Mapping[str, str] | None, subject: str | None = None) -> Steps[RunSession]:
        """The steps of :meth:`Runner.take_over`: the lease at an epoch above ``epoch`` (the run's, as the
        log records it), then the session with its confirmed ``LEASE_ACQUIRED``."""
        yield from activating(self.active, run_id, workflow.name)
        lease = yield from io(self.leases.acquire, self.leases.aacquire, run_id, force=force, epoch=epoch)
        return (yield from RunSession.taking_over(
            self.writer, lease, run_id, last_seq=last_seq, workflow=workflow,
            inputs=PinnedInputs(self.source, input_versions), params=params, attributes=attributes,
            last_hash=last_hash, subject=subject))


def activating(active: ActiveRuns | None, run_id: str, workflow: str) -> Steps[None]:
    """Add a run to the active-runs registry (none: nothing to do); a Redis error fails the start."""
    if active is not None:
        try:
            yield from io(active.add, active.aadd, run_id, workflow)
        except redis.RedisError as err:
            raise RunlogError(f"registering run {run_id!r} as active failed: {err}") from err


def deactivating(active: ActiveRuns | None, run_id: str) -> Steps[None]:
    """Drop a run from the active-runs registry (none: nothing to do)."""
    if active is not None:
        with contextlib.suppress(redis.RedisError):  # a stale entry only costs a sweep's look
            yield from io(active.remove, active.aremove, run_id)


def _crash(point: str) -> None:
    if crash_point(point):
        kill_self()


_START_DOC = """Pin inputs, take the lease and append a confirmed ``RUN_STARTED``.

        Args:
            params: the run's parameters (JSON object), stored as an artifact.
            inputs: explicit input versions; every other input a stage reads is
                pinned at its latest version.
            attributes: carried on ``RUN_STARTED`` (e.g. a submitted run's ``queue`` and ``tenant``);
                Runlog's own attribute names win over them.
            idempotency_key: names the run (its id is derived from the key); the same key
                with the same workflow and params returns the existing run
                (``created=False``, no session; :meth:`RunHandle.result` waits for its
                outcome). See :mod:`runlog.producers.run._start` for a start interrupted by a crash.

        Raises:
            RunConflict: the key names a run with other params or workflow.
            InputNotFound: an input or pinned version does not exist.
        """
