"""A worker's intake: take submitted runs from the submissions topic, start each exactly once, execute
at most ``concurrency`` at a time.

The intake is a member of the consumer group ``<resumer group>.intake`` (the App's resumer group,
:func:`runlog.processors.resume.group_id`, so one App's workers share the submissions as they share
the resume requests; another App's workers see every submission too and leave those of workflows
they do not register). For each submission:

1. a workflow the App does not register: committed, counted ``not_mine``;
2. a ``version`` the App does not serve: parked in Redis for a member that serves it
   (``P:submissions:waiting:<workflow>@<version>``, the record's bytes) and committed; members
   serving that version take parked submissions as they have room;
3. otherwise the run is started with the submission's idempotency key (``Runner.start_run``): the
   key's claim, the lease and a confirmed ``RUN_STARTED``, so a submission delivered twice, or taken
   by a worker that died before its ``RUN_STARTED`` and then by another, starts one run (the
   second start settles the first one's claim from the log); the submission is committed once the
   start returned, and the run executes on one of the intake's ``concurrency`` threads. A worker
   that dies while executing leaves its runs to the resumer group (their leases expire; the sweep
   requests their resumes).

While ``concurrency`` runs execute, the intake pauses its partitions: a submission waits on the log,
not in a worker's memory. A submission that cannot be decoded, names a run other than its key's, or
conflicts with the run its key names goes to the dead-letter topic with its reason.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import cast

import redis
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from prometheus_client import CollectorRegistry, Counter, Gauge

from runlog.processors.dlq import headers as dead_letter_headers
from runlog.processors.fleet._client import SUBJECT, params_of
from runlog.processors.resume import App
from runlog.producers import InputNotFound, Runner, RunResult
from runlog.producers.crash import crash_point, kill_self
from runlog.producers.internal import SubjectKeys, run_id_for_key
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
"""How often a member with room looks for parked submissions of the versions it serves."""


class IntakeMetrics:
    """``runlog_worker_*``: submissions by outcome, runs executing now."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.submissions = Counter("runlog_worker_submissions", "Submissions taken, by outcome (started, "
                                   "existing, not_mine, parked, dead_letter, retry)", ["outcome"],
                                   registry=self.registry)
        self.running = Gauge("runlog_worker_running", "Submitted runs executing in this worker now",
                             registry=self.registry)


@dataclass(frozen=True)
class Taken:
    """What the intake did with one submission."""

    run_id: str
    outcome: str
    """``started`` (this worker started and executes it), ``existing`` (its key's run was started
    before), ``not_mine``, ``parked``, ``dead_letter``."""
    detail: str = ""


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
        self.group = f"{group}.intake"
        self.runner = runner or Runner.from_settings(settings, source=app.source, prices=app.prices)
        self.metrics = metrics if metrics is not None else IntakeMetrics()
        self.on_taken = on_taken
        self.on_result = on_result
        self.producer = Producer(settings.producer_config())
        self.consumer = Consumer(settings.member_config(
            self.group, {"session.timeout.ms": 10_000, "max.poll.interval.ms": 600_000},
            instance_suffix=".intake"))
        self.consumer.subscribe([self.topics.submissions], on_assign=self._on_assign,
                                on_revoke=self._on_revoke)
        self.pool = ThreadPoolExecutor(concurrency, thread_name_prefix="runlog-run")
        self.running: dict[str, Future[RunResult | None]] = {}
        """Run id -> its thread (from its start to its end): the slots taken."""
        self.started = 0
        """Runs this intake started."""
        self._offsets: dict[tuple[str, int], dict[int, bool]] = {}
        """(topic, partition) -> offset -> settled, of the submissions taken and not yet committed."""
        self._settled: queue.SimpleQueue[tuple[str, int, int]] = queue.SimpleQueue()
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._paused = False
        self._last_park_check = 0.0
        self.serves = {f"{n}@{v}" for n, v in app.registry.served()}
        self.parking = redis_client(settings)
        self.keys = SubjectKeys(settings.keyring) if settings.encryption else None

    def close(self, wait: bool = True) -> None:
        """Leave the group; with ``wait``, let the runs executing finish first."""
        self._closing.set()
        try:
            self._settle_offsets()
            self.consumer.close()
        finally:
            self.pool.shutdown(wait=wait, cancel_futures=not wait)
            self.producer.flush(10)
            self.runner.close()
            self.parking.close()

    # -- the loop -----------------------------------------------------------------------------------

    def free(self) -> int:
        """Room for more runs now (a run holds its slot from its start to its end)."""
        self._reap()
        with self._lock:
            return self.concurrency - len(self.running)

    def poll_once(self, timeout: float = 1.0) -> Taken | None:
        """Take at most one submission: what can be decided at once (not mine, parked, dead letter) is
        decided here; a start goes to a run thread (starts run side by side, up to ``concurrency``).
        Offsets are committed in order once everything before them is settled (decided, or its run
        started). While ``concurrency`` runs hold their slots the partitions are paused and the poll
        only serves the group."""
        self._settle_offsets()
        room = self.free() > 0
        self._pause(not room)
        if room and time.monotonic() - self._last_park_check >= PARK_CHECK_S:
            self._last_park_check = time.monotonic()
            parked = self._take_parked()
            if parked is not None:
                return parked
        msg = self.consumer.poll(timeout)
        if msg is None:
            return None
        err = msg.error()
        if err is not None:
            if err.fatal() or err.code() == KafkaError._FATAL:
                raise RunlogError(f"the submissions topic's consumer stopped for good: {err.str()}") from \
                    KafkaException(err)
            log.warning("submissions topic: %s", err)
            return None
        at = (str(msg.topic()), msg.partition(), msg.offset())
        with self._lock:
            self._offsets.setdefault(at[:2], {})[at[2]] = False
        taken = self._take(msg.value(), at)
        if taken.outcome != "starting":
            self._settled.put(at)
        self._settle_offsets()
        return taken

    def serve(self, *, stop: Callable[[], bool] | None = None) -> int:
        """Take submissions until ``stop()``; returns how many runs this intake started."""
        while stop is None or not stop():
            self.poll_once(0.2)
        self._settle_offsets()
        return self.started

    # -- one submission -----------------------------------------------------------------------------

    def _take(self, value: bytes, at: tuple[str, int, int] | None) -> Taken:
        try:
            sub = self.codec.decode(value, RunSubmission)
        except DecodeError as err:
            return self._dead_letter(value, at, "", err.reason, err.detail)
        if sub.workflow not in self.app.registry:
            return self._done(Taken(sub.run_id, "not_mine", f"workflow {sub.workflow!r} is not registered"))
        named = run_id_for_key(sub.idempotency_key)
        if named != sub.run_id:
            return self._dead_letter(value, at, sub.run_id, "run_id_mismatch",
                                     f"key {sub.idempotency_key!r} names {named}")
        wf_label = f"{sub.workflow}@{sub.version}" if sub.version is not None else None
        if wf_label is not None and wf_label not in self.serves:
            self.parking.lpush(self._parked_key(wf_label), value)
            return self._done(Taken(sub.run_id, "parked", f"waits for a member serving {wf_label}"))
        if crash_point("after:SUBMISSION:taken"):
            kill_self()
        with self._lock:
            self.running[sub.run_id] = self.pool.submit(self._start_and_execute, sub, value, at, wf_label)
        self.metrics.running.set(len(self.running))
        return Taken(sub.run_id, "starting")

    def _start_and_execute(self, sub: RunSubmission, value: bytes, at: tuple[str, int, int] | None,
                           wf_label: str | None) -> RunResult | None:
        """A run thread: start the submitted run (again while Redis or the broker is away, until the
        intake stops), settle its offset, execute it."""
        pause = 0.5
        attrs = {k: v for k, v in sub.attributes.items() if k != SUBJECT}
        try:
            while True:
                try:
                    wf = self.app.registry.get(sub.workflow, sub.version)
                    h = self.runner.start_run(wf, params_of(sub, self.keys), sub.inputs or None,
                                              sub.idempotency_key, attributes=attrs,
                                              subject=sub.attributes.get(SUBJECT))
                    break
                except (RunConflict, InputNotFound, WorkflowDefinitionError) as err:
                    self._dead_letter(value, at, sub.run_id, type(err).__name__, str(err))
                    return None
                except (redis.RedisError, DeliveryError, RunlogError) as err:
                    self.metrics.submissions.labels("retry").inc()
                    if self._closing.is_set():  # uncommitted: the partition's next owner takes it
                        log.warning("submission %s: not started (%s); left to the group", sub.run_id, err)
                        if at is None and wf_label is not None:
                            self.parking.rpush(self._parked_key(wf_label), value)
                        return None
                    log.warning("submission %s: not started now (%s); trying again", sub.run_id, err)
                    time.sleep(pause)
                    pause = min(pause * 2, 10.0)
        finally:
            if at is not None:
                self._settled.put(at)
        if h.session is None:
            self._done(Taken(sub.run_id, "existing", "its key's run was started before"))
            return None
        with self._lock:
            self.started += 1
        self._done(Taken(sub.run_id, "started"))
        return self.runner.execute(h.session)

    def _reap(self) -> None:
        with self._lock:
            done = [(r, f) for r, f in self.running.items() if f.done()]
            for run_id, _ in done:
                del self.running[run_id]
        for run_id, fut in done:
            err = fut.exception()
            if err is not None:
                log.warning("run %s: %s: %s (its log says what happened; a resume goes on from there)",
                            run_id, type(err).__name__, err)
            result = fut.result() if err is None else None
            if self.on_result is not None and (err is not None or result is not None):
                self.on_result(run_id, err if err is not None else cast(RunResult, result))
        if done:
            self.metrics.running.set(len(self.running))

    def _done(self, taken: Taken) -> Taken:
        self.metrics.submissions.labels(taken.outcome).inc()
        if taken.outcome not in ("not_mine",):
            log.info("submission %s: %s %s", taken.run_id, taken.outcome, taken.detail)
        if self.on_taken is not None:
            self.on_taken(taken)
        return taken

    def _settle_offsets(self) -> None:
        """Commit, per partition, past every submission settled with nothing unsettled before it."""
        while True:
            try:
                topic, part, off = self._settled.get_nowait()
            except queue.Empty:
                break
            with self._lock:
                offs = self._offsets.get((topic, part))
                if offs is not None and off in offs:
                    offs[off] = True
        commits = []
        with self._lock:
            for (topic, part), offs in self._offsets.items():
                upto = None
                for off in sorted(offs):
                    if not offs[off]:
                        break
                    upto = off
                    del offs[off]
                if upto is not None:
                    commits.append(TopicPartition(topic, part, upto + 1))
        if commits:
            self._commit(commits)

    # -- parking, pausing, committing, dead letters -------------------------------------------------

    def _parked_key(self, wf_label: str) -> str:
        return f"{self.settings.redis_prefix}:submissions:waiting:{wf_label}"

    def _take_parked(self) -> Taken | None:
        for wf_label in sorted(self.serves):
            try:
                value = self.parking.rpop(self._parked_key(wf_label))
            except redis.RedisError as err:
                log.warning("parked submissions not read (%s)", err)
                return None
            if value is not None:
                return self._take(value, None)
        return None

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self._paused and partitions:
            consumer.pause(partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Settled offsets of the leaving partitions are committed while they are still ours; the
        unsettled ones go to the next owner (their starts settle its claims: one run each)."""
        self._settle_offsets()
        with self._lock:
            for tp in partitions:
                self._offsets.pop((tp.topic, tp.partition), None)

    def _pause(self, pause: bool) -> None:
        if pause == self._paused:
            return
        assignment = self.consumer.assignment()
        if assignment:
            (self.consumer.pause if pause else self.consumer.resume)(assignment)
        self._paused = pause

    def _commit(self, offsets: list[TopicPartition]) -> None:
        try:
            self.consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as err:
            if not commit_refused_by_rebalance(err):
                raise
            log.warning("submissions %s not committed, the group moved on: the partitions' owners take "
                        "them again (each run starts once)", [(tp.partition, tp.offset) for tp in offsets])

    def _dead_letter(self, value: bytes, at: tuple[str, int, int] | None, run_id: str, reason: str,
                     detail: str) -> Taken:
        topic, part, off = at if at is not None else (self.topics.submissions, -1, -1)
        log.warning("submission %s[%s]@%s dead-lettered: %s: %s", topic, part, off, reason, detail)
        self.producer.produce(self.topics.dlq, key=run_id.encode() if run_id else None, value=value,
                              headers=list(dead_letter_headers(reason, detail, topic, part, off)))
        if self.producer.flush(30) != 0:
            raise KafkaException(f"dead letter of submission {run_id} was not acknowledged")
        return self._done(Taken(run_id, "dead_letter", f"{reason}: {detail}"))
