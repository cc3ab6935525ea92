"""``runlog.Client``: submit runs to a fleet of workers and follow them from any process.

A client needs the broker and Redis, not the workflow code: :meth:`Client.submit` claims the run's
key and writes a :class:`~runlog.schemas.RunSubmission` to the submissions topic, and returns once
the broker acknowledged it (the submission is durable before ``submit`` returns). A ``runlog
worker`` of the App that registers the workflow starts it (:mod:`runlog.processors.fleet._intake`);
the handle waits for the run's outcome wherever it executes (the projection first, the log when
the projection does not hold the run), as :meth:`runlog.producers.RunHandle.result` does.

Every blocking method has an ``a``-prefixed twin for an event loop; the waits and round trips run
in a worker thread, so the loop never blocks.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Producer

from runlog.processors.fleet._queues import QueueWait, where_waits
from runlog.processors.fleet._submit import SubmissionKeys, produce_submission
from runlog.processors.inspect.log import runs_from_log
from runlog.processors.operate import OperatorRefused, OperatorResult, cancel_run
from runlog.processors.signal import signal_run
from runlog.producers import RunResult
from runlog.producers.internal import (
    KafkaRunLog,
    RunOutcomes,
    SubjectKeys,
    canonical_json,
    open_text,
    run_id_for_key,
    seal_text,
    store_from_settings,
    subject_keys,
)
from runlog.projections import RedisStore, RunState
from runlog.projections.internal import READY
from runlog.schemas import Codec, RunSubmission, Settings, Topics, WorkflowDefinitionError, now_ms
from runlog.schemas.internal import redis_client

__all__ = ["Client", "RunInfo", "SubmittedRun"]

SUBMITTED = "SUBMITTED"
"""The status of a submitted run no worker has started yet."""


@dataclass(frozen=True)
class RunInfo:
    """Where a run stands: ``status`` is the projection's (or the log's) status, or
    :data:`SUBMITTED` before a worker started it."""

    run_id: str
    status: str
    workflow: str | None = None
    version: str | None = None
    stage: str | None = None
    waiting_for: str | None = None
    """The signal the run waits for."""
    error: str | None = None
    labels: Mapping[str, str] | None = None
    """A submitted run's ``queue``, ``tenant`` and ``priority``."""
    queued: QueueWait | None = None
    """A :data:`SUBMITTED` run waiting in a queue: which, its tenant, and why (``global``: the
    queue's fleet-wide concurrency is taken, ``tenant``: its tenant's is, ``turn``: other tenants'
    shares, higher priorities or no free worker; ``dispatched``: a worker is starting it)."""

    @classmethod
    def of(cls, run_id: str, state: RunState | None, queued: QueueWait | None = None,
           opener: Callable[[str], str] = str) -> RunInfo:
        """``opener`` opens a sealed error message (``ArtifactStore.open_text``)."""
        if state is None:
            return cls(run_id, SUBMITTED, queued=queued)
        wf = state.workflow
        err = state.last_error
        return cls(run_id, state.status.value, wf.name if wf else None, wf.version if wf else None,
                   state.stage, state.waiting.signal if state.waiting else None,
                   f"{err.kind}: {opener(err.message)}" if err else None, dict(state.labels))


@dataclass(frozen=True)
class SubmittedRun:
    """A handle on a submitted run, usable from any process (``Client.run(run_id)`` makes one).

    ``created``: this submit made the submission (False: the key named a run submitted or started
    before; the same run)."""

    run_id: str
    created: bool
    client: Client

    def result(self, timeout: float | None = None) -> RunResult:
        """The run's outcome once it has ended (:meth:`runlog.producers.RunHandle.result`).

        Raises:
            RunFailed, ResumeBlocked, RunCancelled: it ended so. TimeoutError: not ended in ``timeout``
                seconds (a run no worker started yet reads as not on the log).
        """
        return self.client.outcomes.result(self.run_id, timeout)

    async def aresult(self, timeout: float | None = None) -> RunResult:
        return await self.client.outcomes.aresult(self.run_id, timeout)

    def status(self) -> RunInfo:
        return self.client.status(self.run_id)

    async def astatus(self) -> RunInfo:
        return await asyncio.to_thread(self.status)

    def signal(self, name: str, data: Any = None, *, by: str, reason: str = "") -> OperatorResult:
        """Deliver signal ``name`` to the run, which waits for it (``runlog signal``)."""
        return signal_run(self.client.settings, self.run_id, name, data, by=by, reason=reason)

    async def asignal(self, name: str, data: Any = None, *, by: str, reason: str = "") -> OperatorResult:
        return await asyncio.to_thread(self.signal, name, data, by=by, reason=reason)

    def cancel(self, *, by: str, reason: str) -> OperatorResult:
        """Cancel the run (``runlog cancel``).

        Raises:
            OperatorRefused: the run has not started yet, is complete or already cancelled.
        """
        if self.client.state(self.run_id) is None:
            raise OperatorRefused(f"run {self.run_id} is submitted but no worker has started it yet; "
                                  "cancel it once it runs (its status leaves SUBMITTED)")
        return cancel_run(self.client.settings, self.run_id, by=by, reason=reason)

    async def acancel(self, *, by: str, reason: str) -> OperatorResult:
        return await asyncio.to_thread(self.cancel, by=by, reason=reason)


class Client:
    """Submits runs to the workers of a fleet and follows them (the module docstring).

    Args:
        settings: the broker, Redis, topic and key prefixes (default: from the environment).
        name: who submits (``submitted_by`` of each submission; default: ``client``).
    """

    def __init__(self, settings: Settings | None = None, *, name: str | None = None) -> None:
        self.settings = settings if settings is not None else Settings.from_env()
        self.name = name or "client"
        self.codec = Codec.from_settings(self.settings)
        self.topic = Topics.of(self.settings).submissions
        self.redis = redis_client(self.settings)
        self.keys = SubmissionKeys(self.redis, self.settings.redis_prefix)
        self.store = RedisStore(self.redis, self.settings.redis_prefix)
        self.artifacts = store_from_settings(self.settings)  # sealed when RUNLOG_ENCRYPTION is on
        self.outcomes = RunOutcomes(KafkaRunLog(self.settings), self.artifacts,
                                    projected=self.store.load_state)
        self._producer: Producer | None = None

    @property
    def producer(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(self.settings.producer_config(**{"linger.ms": 0}))
        return self._producer

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(30)
            self._producer = None
        self.redis.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)

    # -- submitting ---------------------------------------------------------------------------------

    def submit(self, workflow: str, params: Mapping[str, Any] | None = None, *, key: str | None = None,
               version: str | None = None, queue: str = "default", priority: int = 0,
               tenant: str | None = None, inputs: Mapping[str, str] | None = None,
               attributes: Mapping[str, str] | None = None, subject: str | None = None) -> SubmittedRun:
        """Submit a run of ``workflow`` (its name) with ``params``; returns once the submission is on
        the log.

        Args:
            key: the run's idempotency key: the same key with the same workflow and params is the same
                run (``created`` False), with others a ``RunConflict``. Default: a new key.
            version: the version to start (default: the newest the worker that takes it registers).
            queue, priority, tenant: where the run waits and counts (``runlog queues``); carried onto
                the run's ``RUN_STARTED`` attributes with ``attributes``.
            inputs: pinned input versions.
            subject: whose data key encrypts the run's payloads when ``RUNLOG_ENCRYPTION`` is on (the
                submission's parameters too: they travel sealed); see ``Runner.run``.

        Raises:
            WorkflowDefinitionError: an empty workflow name, or parameters that are not a JSON object.
            RunConflict: the key names a run of another workflow or with other parameters.
            DeliveryError: the broker did not acknowledge the submission.
        """
        if not isinstance(workflow, str) or not workflow.strip():
            raise WorkflowDefinitionError("submit needs a workflow name")
        if params is not None and not isinstance(params, Mapping):
            raise WorkflowDefinitionError(f"a run's params are a JSON object, not {type(params).__name__}")
        params_bytes = canonical_json(dict(params or {}))  # WorkflowDefinitionError when not JSON
        idem = key if key is not None else f"submit:{uuid.uuid4().hex}"
        run_id = run_id_for_key(idem)
        store = self.artifacts.for_subject(subject)
        # the params hash a keyed start keeps (keyed by the subject's key when encryption is on)
        created = self.keys.claim(idem, run_id, workflow, store.digest(params_bytes))
        if not created and self.state(run_id) is not None:
            return SubmittedRun(run_id, False, self)
        # a new claim, or one whose submitter may have died before its record: (again) on the log;
        # a second record for the same run starts nothing twice (the worker's keyed start)
        labels = {**(attributes or {}), "runlog.queue": queue, "runlog.priority": str(priority),
                  **({"runlog.tenant": tenant} if tenant is not None else {}),
                  **({SUBJECT: subject} if subject is not None else {})}
        text = params_bytes.decode("utf-8")
        if self.settings.encryption:  # no parameter in clear on the submissions topic either
            keys = subject_keys(self.settings)
            data_key = keys.for_subject(subject or self.settings.default_subject)
            text = seal_text(data_key, text)
        produce_submission(self.producer, self.codec, self.topic, RunSubmission(
            run_id=run_id, workflow=workflow, params=text, idempotency_key=idem,
            submitted_at=now_ms(), version=version, inputs=dict(inputs or {}), queue=queue,
            priority=int(priority), tenant=tenant, submitted_by=self.name, attributes=labels))
        return SubmittedRun(run_id, created, self)

    async def asubmit(self, workflow: str, params: Mapping[str, Any] | None = None, *, key: str | None = None,
                      version: str | None = None, queue: str = "default", priority: int = 0,
                      tenant: str | None = None, inputs: Mapping[str, str] | None = None,
                      attributes: Mapping[str, str] | None = None,
                      subject: str | None = None) -> SubmittedRun:
        """:meth:`submit` for an event loop."""
        return await asyncio.to_thread(self.submit, workflow, params, key=key, version=version, queue=queue,
                                       priority=priority, tenant=tenant, inputs=inputs, attributes=attributes,
                                       subject=subject)

    # -- following ----------------------------------------------------------------------------------

    def run(self, run_id: str) -> SubmittedRun:
        """A handle on any run by its id (submitted here or elsewhere, or started by a Runner)."""
        return SubmittedRun(run_id, False, self)

    def state(self, run_id: str) -> RunState | None:
        """The run's state (the projection's, else the log's); None: not started."""
        return self.outcomes.state(run_id)

    async def astate(self, run_id: str) -> RunState | None:
        """:meth:`state` for an event loop."""
        return await asyncio.to_thread(self.state, run_id)

    def status(self, run_id: str) -> RunInfo:
        """Where the run stands; a submitted run no worker started yet says where it waits, and why."""
        state = self.state(run_id)
        return RunInfo.of(run_id, state, where_waits(self.redis, self.settings.redis_prefix, run_id)
                          if state is None else None, self.artifacts.open_text)

    async def astatus(self, run_id: str) -> RunInfo:
        """:meth:`status` for an event loop."""
        return await asyncio.to_thread(self.status, run_id)

    def list(self, *, status: str | None = None, workflow: str | None = None, tenant: str | None = None,
             queue: str | None = None, limit: int = 100) -> list[RunInfo]:
        """Runs newest first, filtered by status, workflow name, and the ``tenant`` / ``queue`` of
        submitted runs (at most ``limit``): the projection's runs when it is ready, else every run on
        the events topic folded (as ``runlog runs`` lists them without a projector)."""
        marker = self.store.marker()
        states: dict[str, RunState | None]
        if marker is not None and marker.state == READY:
            ids = self.store.runs()
            states = dict(self.store.load_states(ids)) if ids else {}
        else:
            states = dict(runs_from_log(self.settings))
        out = [RunInfo.of(i, s, opener=self.artifacts.open_text) for i, s in states.items() if s is not None]
        out = [r for r in out
               if (status is None or r.status == status) and (workflow is None or r.workflow == workflow)
               and (tenant is None or (r.labels or {}).get("tenant") == tenant)
               and (queue is None or (r.labels or {}).get("queue") == queue)]
        order = {i: s.updated_at for i, s in states.items() if s is not None}
        out.sort(key=lambda r: order.get(r.run_id, 0), reverse=True)
        return out[:limit]

    async def alist(self, **filters: Any) -> builtins.list[RunInfo]:
        return await asyncio.to_thread(self.list, **filters)


SUBJECT = "runlog.subject"
"""The submission attribute naming the run's subject (``Runner.run(..., subject=)``)."""


def params_of(submission: RunSubmission, keys: SubjectKeys | None = None) -> dict[str, Any]:
    """A submission's parameters (a JSON object), opened with ``keys`` when they travel sealed."""
    value = json.loads(open_text(keys, submission.params) if keys is not None else submission.params)
    if not isinstance(value, dict):
        raise WorkflowDefinitionError("a submission's params are not a JSON object")
    return value
