"""A worker's intake: take submitted runs from the submissions topic into the App's queues in Redis,
and start the queued runs the queues hand this worker, each exactly once, at most ``concurrency`` at
a time.

The intake is a member of the consumer group ``<resumer group>.intake`` (the App's resumer group,
:func:`runlog.processors.resume.group_id`, so one App's workers share the submissions as they share
the resume requests; another App's workers see every submission too and leave those of workflows
they do not register). For each submission on the topic:

1. a workflow the App does not register: committed, counted ``not_mine``;
2. a ``version`` the App does not serve: parked in Redis for a member that serves it
   (``P:submissions:waiting:<workflow>@<version>``, the record's bytes) and committed; members
   serving that version queue parked submissions as they look for work;
3. otherwise it is queued (:mod:`runlog.processors.fleet._queues`: its queue, its tenant, its
   priority) and committed: from then on it waits in Redis, not on the log nor in a worker.

While it has a free slot the intake asks its queues for the next run (a Lua ``dispatch``: priority,
the tenants' fair shares, the queue's and the tenant's concurrency across the fleet) and starts it
with the submission's idempotency key (``Runner.start_run``: the key's claim, the lease and a
confirmed ``RUN_STARTED``), so a submission queued twice, or dispatched to a worker that died before
its ``RUN_STARTED`` and then to another, starts one run (the second start settles the first one's
claim from the log). The run executes on one of the intake's ``concurrency`` threads and holds its
queue slot until it returns; the worker refreshes the slot's expiry meanwhile, so a dead worker's
slots come back (and its runs go to the resumer group: their leases expire, the sweep requests
their resumes). A submission that cannot be decoded, names a run other than its key's, or
conflicts with the run its key names goes to the dead-letter topic with its reason.

Redis lost the queues? A worker that finds a declared queue's ``built`` marker missing rebuilds the
App's queues from the log (:func:`runlog.processors.fleet._rebuild.rebuild_queues`), which sets it.
Every worker declares the queues' limits again on each look, and only a rebuild sets the marker, so
a worker that may not rebuild yet (``REBUILD_GAP_S`` since its last one) leaves the loss visible to
the others, and rebuilds itself once the gap has passed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import redis
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from prometheus_client import CollectorRegistry, Counter, Gauge

from runlog.processors.dlq import headers as dead_letter_headers
from runlog.processors.fleet._client import SUBJECT, params_of
from runlog.processors.fleet._queues import Dispatched, QueueStats, RedisQueues, all_queues
from runlog.processors.fleet._rebuild import RebuildReport, rebuild_queues
from runlog.processors.resume import App
from runlog.producers import InputNotFound, Runner, RunResult
from runlog.producers.crash import crash_point, kill_self
from runlog.producers.internal import RunSession, run_id_for_key, subject_keys
from runlog.projections import RunState
from runlog.schemas import (
    Codec,
    DecodeError,
    DeliveryError,
    RunConflict,
    RunlogError,
    RunSubmission,
    Settings,
    Topics,
    WorkflowDefinitionError,
)
from runlog.schemas.internal import commit_refused_by_rebalance, redis_client

__all__ = ["IntakeMetrics", "SubmissionIntake", "Taken"]

log = logging.getLogger("runlog.worker")

PARK_CHECK_S = 1.0
"""How often a member looks for parked submissions of the versions it serves (and queues them)."""

SCAN_S = 2.0
"""How often a member re-declares its App's queues, checks their keys are there (else rebuilds them
from the log), finds the queues other members created and reads their gauges."""

REBUILD_GAP_S = 30.0
"""At most one rebuild per member in this many seconds (a Redis that keeps losing keys)."""


class IntakeMetrics:
    """``runlog_worker_*``: submissions by outcome, runs executing now; ``runlog_queue_*``: pending and
    running per queue and tenant (as this worker last read them)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.submissions = Counter("runlog_worker_submissions", "Submissions taken, by outcome (queued, "
                                   "duplicate, started, existing, not_mine, parked, dead_letter, retry)",
                                   ["outcome"],
                                   registry=self.registry)
        self.running = Gauge("runlog_worker_running", "Submitted runs executing in this worker now",
                             registry=self.registry)
        self.queue_pending = Gauge("runlog_queue_pending", "Submitted runs waiting in a queue, per tenant",
                                   ["queue", "tenant"], registry=self.registry)
        self.queue_running = Gauge("runlog_queue_running", "Runs of a queue executing across the fleet, "
                                   "per tenant", ["queue", "tenant"], registry=self.registry)
        self.resumes_queued = Counter("runlog_queue_resumes_queued", "Resumes of a queue's runs that found "
                                      "no slot (asked for again a second later), by reason (global, "
                                      "tenant, held)", ["queue", "reason"], registry=self.registry)

    def queue(self, stats: QueueStats) -> None:
        for tenant in set(stats.pending) | set(stats.running) | set(stats.starts):
            self.queue_pending.labels(stats.name, tenant).set(stats.pending.get(tenant, 0))
            self.queue_running.labels(stats.name, tenant).set(stats.running.get(tenant, 0))


@dataclass(frozen=True)
class Taken:
    """What the intake did with one submission."""

    run_id: str
    outcome: str
    """``queued`` (into its queue), ``duplicate`` (pending, running or started already), ``started``
    (this worker started and executes it), ``existing``
    (its key's run was started before), ``not_mine``, ``parked``, ``dead_letter``, ``retry`` (not
    started now: queued again)."""
    detail: str = ""
    tenant: str | None = None
    at: float = 0.0
    """``time.monotonic()`` when it happened."""


class SubmissionIntake:
    """Takes submissions for ``app`` (the module docstring).

    Args:
        group: the resumer group of the App (the intake's group is ``<group>.intake``).
        concurrency: at most this many submitted runs execute at once in this process.
        on_taken: called with every :class:`Taken`; ``on_result`` with each executed run's result or
            error (progress output and tests).
    """

    def __init__(self, settings: Settings, app: App, *, group: str, concurrency: int = 4,
                 runner: Runner | None = None, metrics: IntakeMetrics | None = None,
                 on_taken: Callable[[Taken], None] | None = None,
                 on_result: Callable[[str, RunResult | BaseException], None] | None = None) -> None:
        if concurrency < 1:
            raise WorkflowDefinitionError(f"a worker's concurrency is at least 1, not {concurrency}")
        self.settings = settings
        self.app = app
        self.concurrency = concurrency
        self.topics = Topics.of(settings)
        self.codec = Codec.from_settings(settings)
        self.app_group = group
        self.group = f"{group}.intake"
        self.runner = runner or Runner.from_settings(settings, source=app.source, prices=app.prices)
        self.metrics = metrics if metrics is not None else IntakeMetrics()
        self.on_taken = on_taken
        self.on_result = on_result
        self.producer = Producer(settings.producer_config())
        self.consumer = Consumer(settings.member_config(
            self.group, defaults={"session.timeout.ms": 10_000, "max.poll.interval.ms": 600_000},
            instance_suffix=".intake"))
        self.consumer.subscribe([self.topics.submissions])
        self.pool = ThreadPoolExecutor(concurrency, thread_name_prefix="runlog-run")
        self.running: dict[str, tuple[str, Future[RunResult]]] = {}
        """run id -> (its queue, its execution)."""
        self.resuming: dict[str, str] = {}
        """run id -> its queue, of the resumes this worker's resumer was admitted for (:meth:`admit`)."""
        self._lock = threading.Lock()
        self._last_park_check = 0.0
        self._last_refresh = 0.0
        self._last_scan = 0.0
        self._last_rebuild = 0.0
        self.started = 0
        self.serves = {f"{n}@{v}" for n, v in app.registry.served()}
        self.parking = redis_client(settings)
        self.queues = RedisQueues(self.parking, settings.redis_prefix, group, ttl_ms=settings.lease_ttl_ms,
                                  owner=f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}")
        self.declares = list(dict.fromkeys([*(q.name for q in app.queues), "default"]))
        """The queues this intake declares (their limits in Redis; keys missing: a rebuild)."""
        self.known = list(self.declares)
        """The queues this intake dispatches from, in turn: the App's, ``default``, those it has seen."""
        self._turn = 0
        self.keys = subject_keys(settings) if settings.encryption else None
        self.rebuilds: list[RebuildReport] = []

    def close(self, wait: bool = True) -> None:
        """Leave the group; with ``wait``, let the runs executing finish first (and free their slots)."""
        try:
            self.consumer.close()
        finally:
            self.pool.shutdown(wait=wait, cancel_futures=not wait)
            if wait:
                with contextlib.suppress(redis.RedisError):
                    self._reap()
            self.producer.flush(10)
            self.runner.close()
            self.parking.close()

    # -- the loop -----------------------------------------------------------------------------------

    def free(self) -> int:
        """Room for more runs now."""
        self._reap()
        with self._lock:
            return self.concurrency - len(self.running)

    def poll_once(self, timeout: float = 1.0) -> Taken | None:
        """Start at most one queued run (when this worker has room) and take at most one submission
        from the topic into its queue; returns what was done last (None: nothing)."""
        try:
            self._maintain()
        except redis.RedisError as lost:
            log.warning("queues not maintained now (%s)", lost)
        dispatched = self._dispatch_one() if self.free() > 0 else None
        msg = self.consumer.poll(0 if dispatched is not None else timeout)
        if msg is None:
            return dispatched
        err = msg.error()
        if err is not None:
            if err.fatal() or err.code() == KafkaError._FATAL:
                raise RunlogError(f"the submissions topic's consumer stopped for good: {err.str()}") from \
                    KafkaException(err)
            log.warning("submissions topic: %s", err)
            return dispatched
        taken = self._take(msg.value(), msg)
        if taken is None:  # not queued now (Redis away): again later
            self.consumer.seek(TopicPartition(msg.topic(), msg.partition(), msg.offset()))
            time.sleep(0.5)
            return dispatched
        self._commit(msg)
        return taken

    def serve(self, *, stop: Callable[[], bool] | None = None) -> int:
        """Take and start submissions until ``stop()``; returns how many runs this intake started."""
        while stop is None or not stop():
            self.poll_once(0.2)
        return self.started

    # -- queues: keeping them, dispatching from them --------------------------------------------------

    def _maintain(self) -> None:
        now = time.monotonic()
        if now - self._last_scan >= SCAN_S or not self._last_scan:
            self._last_scan = now
            declared = [self.app.queue(name) for name in self.declares]
            missing = [q.name for q in declared if not self.queues.built(q.name)]
            if missing and (not self.rebuilds or now - self._last_rebuild >= REBUILD_GAP_S):
                self._last_rebuild = now
                report = rebuild_queues(self.settings, self.app, self.queues)
                self.rebuilds.append(report)
                log.warning("queues %s had no keys in Redis: rebuilt from the log (%s)", missing, report)
            elif missing:
                log.info("queues %s had no keys in Redis: another member rebuilds them, or this one in "
                         "%.0f s", missing, REBUILD_GAP_S - (now - self._last_rebuild))
            for q in declared:
                self.queues.declare(q)
            for st in all_queues(self.parking, self.settings.redis_prefix):
                if st.group == self.app_group:
                    if st.name not in self.known:
                        self.known.append(st.name)
                    self.metrics.queue(st)
        if now - self._last_refresh >= self.settings.lease_ttl_ms / 3000:
            self._last_refresh = now
            with self._lock:
                held: dict[str, list[str]] = {}
                for run_id, (queue, _) in self.running.items():
                    held.setdefault(queue, []).append(run_id)
                for run_id, queue in self.resuming.items():
                    held.setdefault(queue, []).append(run_id)
            for queue, ids in held.items():
                kept = self.queues.refresh(queue, ids)
                if kept < len(ids):
                    log.warning("queue %s: %d of this worker's slots expired before it refreshed them",
                                queue, len(ids) - kept)
        if now - self._last_park_check >= PARK_CHECK_S:
            self._last_park_check = now
            self._queue_parked()

    def admit(self, state: RunState) -> Callable[[], None] | str | None:
        """The resumer's gate (:attr:`runlog.processors.resume.Resumer.gate`): a resume of a run that was
        submitted to a queue (its ``queue`` label) takes a slot of that queue while it executes, so the
        queue's and its tenant's concurrency count it; returns the slot's release, or why there is none
        now. A run started otherwise (no queue label) is not gated."""
        queue = state.labels.get("queue") if state.labels else None
        if not queue:
            return None
        tenant = state.labels.get("tenant") or None
        try:
            got = self.queues.admit(queue, state.run_id, tenant)
        except redis.RedisError as err:  # the queue is unknown now: the resume acts unslotted
            log.warning("run %s: no slot of queue %s asked for its resume (%s)", state.run_id, queue, err)
            return None
        if got != "ok":
            self.metrics.resumes_queued.labels(queue, got).inc()
            return f"queue {queue!r} has no slot for its resume now ({got})"
        with self._lock:
            self.resuming[state.run_id] = queue

        def release() -> None:
            with self._lock:
                self.resuming.pop(state.run_id, None)
            try:
                self.queues.release(queue, state.run_id)
            except redis.RedisError as lost:  # it expires instead
                log.warning("run %s: its slot in queue %s not freed now (%s); it expires", state.run_id,
                            queue, lost)

        return release

    def _dispatch_one(self) -> Taken | None:
        for i in range(len(self.known)):
            queue = self.known[(self._turn + i) % len(self.known)]
            try:
                got = self.queues.dispatch(queue)
            except redis.RedisError as err:
                log.warning("queue %s: no dispatch now (%s)", queue, err)
                return None
            if isinstance(got, Dispatched):
                self._turn = (self._turn + i + 1) % len(self.known)
                return self._start(got)
        return None

    # -- one submission -----------------------------------------------------------------------------

    def _take(self, value: bytes, msg: Message | None) -> Taken | None:
        """Queue a submission from the topic (or a parked one)."""
        try:
            sub = self.codec.decode(value, RunSubmission)
        except DecodeError as err:
            return self._dead_letter(value, msg, "", err.reason, err.detail)
        if sub.workflow not in self.app.registry:
            return self._done(Taken(sub.run_id, "not_mine", f"workflow {sub.workflow!r} is not registered"))
        named = run_id_for_key(sub.idempotency_key)
        if named != sub.run_id:
            return self._dead_letter(value, msg, sub.run_id, "run_id_mismatch",
                                     f"key {sub.idempotency_key!r} names {named}")
        wf_label = f"{sub.workflow}@{sub.version}" if sub.version is not None else None
        if wf_label is not None and wf_label not in self.serves:
            self.parking.lpush(self._parked_key(wf_label), value)
            return self._done(Taken(sub.run_id, "parked", f"waits for a member serving {wf_label}",
                                    sub.tenant))
        try:
            added = self.queues.enqueue(sub.queue, sub.run_id, sub.tenant, sub.priority, sub.submitted_at,
                                        value)
        except redis.RedisError as err:
            log.warning("submission %s: not queued now (%s); trying again", sub.run_id, err)
            self.metrics.submissions.labels("retry").inc()
            return None
        if sub.queue not in self.known:
            self.known.append(sub.queue)
        return self._done(Taken(sub.run_id, "queued" if added else "duplicate",
                                f"queue {sub.queue}" if added else "queued or started before", sub.tenant))

    def _start(self, d: Dispatched) -> Taken:
        """Start a run its queue handed this worker (the module docstring)."""
        try:
            sub = self.codec.decode(d.record, RunSubmission)
        except DecodeError as err:
            self.queues.release(d.queue, d.run_id)
            return self._dead_letter(d.record, None, d.run_id, err.reason, err.detail)
        wf_label = f"{sub.workflow}@{sub.version}" if sub.version is not None else None
        if sub.workflow not in self.app.registry or (wf_label is not None and wf_label not in self.serves):
            self.parking.lpush(self._parked_key(wf_label or sub.workflow), d.record)
            self.queues.release(d.queue, d.run_id, mode="drop")
            return self._done(Taken(sub.run_id, "parked", f"waits for a member serving {wf_label}", d.tenant))
        if crash_point("after:SUBMISSION:taken"):
            kill_self()
        try:
            wf = self.app.registry.get(sub.workflow, sub.version)
            h = self.runner.start_run(wf, params_of(sub, self.keys), sub.inputs or None, sub.idempotency_key,
                                      attributes={k: v for k, v in sub.attributes.items() if k != SUBJECT},
                                      subject=sub.attributes.get(SUBJECT))
        except (RunConflict, InputNotFound, WorkflowDefinitionError) as err:
            self.queues.release(d.queue, d.run_id)
            return self._dead_letter(d.record, None, sub.run_id, type(err).__name__, str(err))
        except (redis.RedisError, DeliveryError, RunlogError) as err:
            log.warning("submission %s: not started now (%s); queued again", sub.run_id, err)
            with contextlib.suppress(redis.RedisError):  # else its slot expires and it waits again
                self.queues.release(d.queue, d.run_id, mode="again")
            return self._done(Taken(sub.run_id, "retry", str(err), d.tenant))
        if h.session is None:
            self.queues.release(d.queue, d.run_id)
            return self._done(Taken(sub.run_id, "existing", "its key's run was started before", d.tenant))
        with self._lock:
            self.running[sub.run_id] = (d.queue, self.pool.submit(self._execute, h.session))
            self.started += 1
            self.metrics.running.set(len(self.running))
        return self._done(Taken(sub.run_id, "started", f"queue {d.queue}", d.tenant))

    def _execute(self, session: RunSession) -> RunResult:
        return self.runner.execute(session)

    def _reap(self) -> None:
        with self._lock:
            done = [(r, q, f) for r, (q, f) in self.running.items() if f.done()]
            for run_id, _, _ in done:
                del self.running[run_id]
        for run_id, queue, fut in done:
            try:
                self.queues.release(queue, run_id)
            except redis.RedisError as lost:  # its slot expires instead
                log.warning("run %s: its slot in queue %s not freed now (%s); it expires", run_id, queue,
                            lost)
            err = fut.exception()
            if err is not None:
                log.warning("run %s: %s: %s (its log says what happened; a resume goes on from there)",
                            run_id, type(err).__name__, err)
            if self.on_result is not None:
                self.on_result(run_id, err if err is not None else fut.result())
        if done:
            self.metrics.running.set(len(self.running))

    def _done(self, taken: Taken) -> Taken:
        taken = dataclasses.replace(taken, at=time.monotonic())
        self.metrics.submissions.labels(taken.outcome).inc()
        if taken.outcome not in ("not_mine",):
            log.info("submission %s: %s %s", taken.run_id, taken.outcome, taken.detail)
        if self.on_taken is not None:
            self.on_taken(taken)
        return taken

    # -- parking, committing, dead letters -------------------------------------------------

    def _parked_key(self, wf_label: str) -> str:
        return f"{self.settings.redis_prefix}:submissions:waiting:{wf_label}"

    def _queue_parked(self) -> None:
        for wf_label in sorted(self.serves):
            try:
                value = self.parking.rpop(self._parked_key(wf_label))
            except redis.RedisError as err:
                log.warning("parked submissions not read (%s)", err)
                return
            if value is not None and self._take(value, None) is None:  # not queued now: back, next round
                self.parking.rpush(self._parked_key(wf_label), value)

    def _commit(self, msg: Message) -> None:
        try:
            self.consumer.commit(message=msg, asynchronous=False)
        except KafkaException as err:
            if not commit_refused_by_rebalance(err):
                raise
            log.warning("submission %s[%s]@%s not committed (%s): a later commit covers it, or the "
                        "partition's owner takes it again (its run starts once)", msg.topic(),
                        msg.partition(), msg.offset(), err.args[0] if err.args else err)

    def _dead_letter(self, value: bytes, msg: Message | None, run_id: str, reason: str, detail: str) -> Taken:
        topic = str(msg.topic()) if msg is not None else self.topics.submissions
        part, off = (msg.partition(), msg.offset()) if msg is not None else (-1, -1)
        log.warning("submission %s[%s]@%s dead-lettered: %s: %s", topic, part, off, reason, detail)
        self.producer.produce(self.topics.dlq, key=run_id.encode() if run_id else None, value=value,
                              headers=list(dead_letter_headers(reason, detail, topic, part, off)))
        if self.producer.flush(30) != 0:
            raise KafkaException(f"dead letter of submission {run_id} was not acknowledged")
        return self._done(Taken(run_id, "dead_letter", f"{reason}: {detail}"))
