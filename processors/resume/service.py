"""The resumer consumer: one consumer group per App on the resume topic, plus a sweeper.

Deployment rule: **one resumer group per App.** A :class:`ResumerService` joins the
group ``<settings.resumer_group>.<app id>`` (``RUNLOG_RESUMER_GROUP`` is the prefix),
where the app id is ``App.name`` when given, else ``wf-`` and the first 12 hex digits of
the sha256 of the App's sorted workflow names joined by newlines (:func:`app_id`): stable
across processes and restarts, and the same for every member started with the same App.
Every group therefore sees every resume request. A group whose App does not register
the run's workflow (by name) commits the request without acting: outcome ``not_mine``,
logged at debug, no lease taken, nothing appended. Run several members of one App's group to
share its work (up to the partition count); run one group per App so no workflow is left without
a resumer, and register each workflow name in one App only: two Apps with the same name both act
on its runs (the lease lets one continue).

Versions (:mod:`runlog.processors.resume._versions`): the group name hashes workflow *names*, not
versions, so the members of a rolling deploy (old ones serving ``orders@1``, new ones ``orders@1``
and ``orders@2``) share one group. A run is pinned to the version it started on; a member whose App
registers the name but not that version answers ``not_served``: it parks the run in Redis
(``P:versions:waiting:<workflow>@<version>``) and commits the request, never blocking it. Every
member advertises the versions it serves and claims the parked runs of those versions about once a
second (:data:`PICKUP_S`), so a run waits for exactly as long as no live member serves its version.
The same version registered with another definition is still a strict-resume refusal and blocks
the run (a changed definition needs a new version).

Delivery semantics: at-least-once. A ``ResumeRequest`` is committed only after its resume
returned (completed, blocked, failed, nothing_to_do, superseded, not_mine) or its retry was scheduled
(contended); a resumer that dies mid-resume leaves the request uncommitted, so another
member of the group gets it again. Resuming twice is safe: the lease and the fold's epoch
fencing let exactly one writer continue a run, the other backs off (``contended``); and a resume is
final: a request handled after the run became blocked, completed, failed, cancelled or waiting, or
after another resume took a later epoch than the request's ``seen_epoch``, appends nothing and
calls nothing (outcomes ``blocked``, ``nothing_to_do``, ``failed``, ``cancelled``, ``waiting``,
``superseded``). A contended run's retry keeps the ``seen_epoch`` of its requests.

A request answered ``contended`` (another writer's lease is still alive, e.g. a crashed
worker's lease that has not expired yet) is retried in memory once the lease can have
expired: at now + the lease key's remaining PTTL + :data:`RETRY_MARGIN_S`, at most
:data:`CONTENDED_RETRIES` times per run; then a warning is logged and the sweep remains
the backstop. Retries are lost when the process stops (the sweep covers them too).

Requests are keyed by run id, so all requests for one run land on one partition and are
handled by one member of a group at a time.

Members come and go (the DESIGN's "Motion"): the group uses the cooperative-sticky assignor, so a
member joining or leaving moves only the partitions that change owner; a commit refused because
the group moved on since the poll (``ILLEGAL_GENERATION``, ``REBALANCE_IN_PROGRESS``,
``UNKNOWN_MEMBER_ID``, ... see :data:`runlog.schemas._kafka.REBALANCE_COMMIT_ERRORS`) is logged at
WARNING with the request's partition and offset and the member goes on: the partition's new owner
gets the request again and resumes idempotently. Any other commit error, or a fatal consumer error
(fenced by another member with the same ``group.instance.id``), raises. With
``RUNLOG_GROUP_INSTANCE_ID`` set the member is static (``group.instance.id``): restarted within the
session timeout (10 s) it keeps its partitions without a rebalance. :meth:`ResumerService.close`
closes the consumer, which leaves the group (a static member's partitions wait out the timeout).

The sweeper requests the resume of runs of *its App's workflows* whose lease key is gone
from Redis (their worker died and the lease expired): the runs of the writer-side active
set (:class:`runlog.producers.run._active.ActiveRuns`, ``P:runs:active``; needs no projector) and,
for runs written before that set existed, those the projection shows ``RUNNING``. A
resume that finds the run completed, blocked or failed removes it from the active set.

Undecodable requests, and requests for runs neither Redis nor the log knows, go to the
dead-letter topic with their reason, logged at WARNING.

Metrics: every service counts into its own ``prometheus_client`` registry
(:class:`~runlog.processors.metrics.ResumerMetrics`, ``service.metrics.registry``): requests, resumes
by outcome and their duration, contended retries, sweeps and the resumes they requested, dead
letters, the runs waiting for a version's member and the members per version, the open runs per
version and status (:mod:`runlog.processors.resume._drains`), and the appends of the resumer's writer
(``runlog_writer_*``). ``metrics_port`` serves it on ``GET /metrics``.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable

import redis
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from runlog.processors.dlq import headers as dead_letter_headers
from runlog.processors.metrics import MetricsServer, ResumerMetrics
from runlog.processors.resume._drains import OpenRunsGauge
from runlog.processors.resume._retries import CONTENDED_RETRIES, RETRY_MARGIN_S, ContendedRetries
from runlog.processors.resume._sweep import Sweeper, SweepReport
from runlog.processors.resume._timers import Timers
from runlog.processors.resume._versions import PICKUP_S, Advertiser, VersionPickup, VersionRoutes, label
from runlog.processors.resume.request import request_resume
from runlog.processors.resume.resumer import NOT_ACTED, App, ResumeOutcome, Resumer, UnknownRun
from runlog.processors.schedule import ScheduleBook, Ticker
from runlog.producers.internal import ActiveRuns, LedgerUnavailable, lease_key
from runlog.projections import ProjectionStoreError, RedisStore, RunStatus
from runlog.schemas import (
    AuthenticationFailed,
    Codec,
    ConfigError,
    DecodeError,
    DeliveryError,
    LogUnavailable,
    ResumeRequest,
    RunlogError,
    Settings,
    Topics,
)
from runlog.schemas.internal import commit_refused_by_rebalance, from_headers, redis_client

__all__ = ["CONTENDED_RETRIES", "PICKUP_S", "RETRY_MARGIN_S", "ResumerService", "SweepReport", "app_id",
           "group_id"]

log = logging.getLogger("runlog.resumer")

_DONE = frozenset({"completed", "nothing_to_do", "blocked", "failed", "cancelled"})
"""Outcomes after which a run is no longer active (removed from the active set)."""


def app_id(app: App) -> str:
    """The App's part of its resumer group name: ``app.name``, else ``wf-`` + the first 12 hex
    digits of sha256 over the sorted registered workflow names joined by newlines."""
    if app.name:
        return app.name
    names = "\n".join(sorted(app.registry.names()))
    return "wf-" + hashlib.sha256(names.encode("utf-8")).hexdigest()[:12]


def group_id(settings: Settings, app: App) -> str:
    """The consumer group of ``app``'s resumers: ``<settings.resumer_group>.<app_id(app)>``, under
    the topic prefix (:meth:`Settings.group_id`)."""
    return settings.group_id(f"{settings.resumer_group}.{app_id(app)}")


class ResumerService:
    """Consumes resume requests as one member of its App's resumer group and sweeps for dead runs.

    It holds its parts as fields: :attr:`retries` (the contended runs' retries,
    :class:`~runlog.processors.resume._retries.ContendedRetries`), :attr:`sweeper` (the sweep,
    :class:`~runlog.processors.resume._sweep.Sweeper`) and :attr:`pickup` (parking and picking up runs
    by version, :class:`~runlog.processors.resume._versions.VersionPickup`); each gets the service's
    resume as a callable.

    Args:
        settings: services and names; the group is :func:`group_id` (``settings.resumer_group``
            is its prefix).
        app: the application whose runs this resumer may continue; requests for runs of
            other workflows are committed as ``not_mine``.
        on_outcome: called with every resume's outcome (for progress output and tests);
            not with ``not_mine`` ones.
        accept: asked before every resume (a request's, a contended run's retry, a version pickup);
            runs it refuses are not resumed (a demo or test resumer that owns only some runs).
        metrics: where to count (``runlog_resumer_*``; the resumer's writer adds ``runlog_writer_*``
            to the same registry); a new :class:`~runlog.processors.metrics.ResumerMetrics` with a registry
            of its own when None.
        metrics_port: serve the registry on ``GET /metrics`` at this port (0: a free one, see
            ``metrics_server.port``); None (the default): no HTTP server.
        tracer_provider: where resume spans go (None: the global provider; :mod:`runlog.processors._tracing`).
    """

    def __init__(self, settings: Settings, app: App, *,
                 on_outcome: Callable[[ResumeOutcome], None] | None = None,
                 accept: Callable[[str], bool] | None = None, tracer_provider: object = None,
                 metrics: ResumerMetrics | None = None, metrics_port: int | None = None) -> None:
        self.settings = settings
        self.app = app
        self.topics = Topics.of(settings)
        self.codec = Codec.from_settings(settings)
        self.metrics = metrics if metrics is not None else ResumerMetrics()
        self.projection = RedisStore.from_settings(settings)
        self.resumer = Resumer(settings, app, projection=self.projection,
                               metrics_registry=self.metrics.registry, tracer_provider=tracer_provider)
        self.redis = redis_client(settings)
        self.active = ActiveRuns(self.redis, settings.redis_prefix)
        self.producer = Producer(settings.producer_config())
        self.group = group_id(settings, app)
        # cooperative-sticky (consumer_config's assignor): a member joining or leaving moves only the
        # partitions that change owner; static membership when RUNLOG_GROUP_INSTANCE_ID is set
        self.consumer = Consumer(settings.member_config(
            self.group, defaults={"session.timeout.ms": 10_000, "max.poll.interval.ms": 600_000}))
        self.partitions: frozenset[int] = frozenset()
        """The resume topic's partitions this member owns now (kept by the rebalance callbacks, which
        run inside :meth:`poll_once`; read it from any thread)."""
        self.consumer.subscribe([self.topics.resume], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                on_lost=self._on_lost)
        self.member = settings.group_instance_id or \
            f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.serves = tuple(label(n, v) for n, v in app.registry.served())
        """The ``workflow@version`` labels this member serves (advertised to the group)."""
        self.routes = VersionRoutes(self.redis, settings.redis_prefix)
        self.advertiser = Advertiser(self.routes, self.member, self.serves).start()
        self.open_runs = OpenRunsGauge(self.projection, self.metrics.open_runs, self.member)
        """``runlog_resumer_open_runs``, refreshed from the pick-up tick every 10 s
        (:mod:`runlog.processors.resume._drains`)."""
        self._last_pickup = 0.0
        log.info("resumer group %s (member %s) serving %s", self.group, self.member, ", ".join(self.serves))
        self.on_outcome = on_outcome
        self.accept = accept
        self._last_sweep = 0.0
        self.outcomes: list[ResumeOutcome] = []
        self.not_mine = 0
        """Requests committed as ``not_mine`` (runs of workflows this App does not register)."""
        self.not_served = 0
        """Resumes answered ``not_served`` (runs pinned to a version this App does not register:
        parked for a member that does)."""
        self.retries = ContendedRetries(self.redis, self.lease_key, settings.lease_ttl_ms,
                                        resume=self._retry, metrics=self.metrics)
        """The contended runs, retried once their lease can have expired."""
        self.sweeper = Sweeper(client=self.redis, projection=self.projection, active=self.active,
                               routes=self.routes, workflows=app.registry.names, lease_key=self.lease_key,
                               request=self._request, metrics=self.metrics,
                               turn_key=f"{settings.redis_prefix}:sweep:{self.group}", member=self.member,
                               interval_ms=settings.sweep_interval_ms, on_log=self._status_on_log)
        """Requests the resume of the runs nobody resumes."""
        self.timers = Timers(active=self.active, projection=self.projection, workflows=app.registry.names,
                             request=self._request, metrics=self.metrics)
        """Wakes the runs whose sleep or wait deadline has come (any member, one request each)."""
        self.schedules = ScheduleBook(settings, self.redis)
        self.ticker = Ticker(book=self.schedules, runner=self.resumer.runner, workflows=app.registry.get,
                             names=app.registry.names, request=self._request,
                             turn_key=f"{settings.redis_prefix}:schedules:turn:{self.group}",
                             member=self.member)
        """Starts one run per tick of the schedules of this App's workflows (one member per turn)."""
        self._declared = False
        self.pickup = VersionPickup(self.routes, self.serves, projection=self.projection,
                                    resume=self._pick_up, finished=self._finished, metrics=self.metrics)
        """Parks the runs of versions this member does not serve, picks up those of versions it does."""
        self.metrics_server = MetricsServer(self.metrics.registry, metrics_port, settings.metrics_host) \
            if metrics_port is not None else None

    def close(self) -> None:
        try:
            self.advertiser.close()
            self.consumer.close()
        finally:
            self.producer.flush(10)
            self.resumer.close()
            self.schedules.close()
            self.redis.close()
            self.projection.client.close()
            if self.metrics_server is not None:
                self.metrics_server.close()

    def __enter__(self) -> ResumerService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- membership: partitions move as members join and leave (cooperative: only the moved ones) --

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        got = {tp.partition for tp in partitions}
        self.partitions = self.partitions | got
        if got:
            log.info("resumer group %s: assigned partitions %s (now %d)", self.group, sorted(got),
                     len(self.partitions))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        gone = {tp.partition for tp in partitions}
        self.partitions = self.partitions - gone
        if gone:
            log.info("resumer group %s: revoked partitions %s (now %d)", self.group, sorted(gone),
                     len(self.partitions))

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        gone = {tp.partition for tp in partitions}
        self.partitions = self.partitions - gone
        log.warning("resumer group %s: lost partitions %s (this member was dropped from the group; their "
                    "uncommitted requests go to the new owners)", self.group, sorted(gone))

    def lease_key(self, run_id: str) -> str:
        return lease_key(self.settings.redis_prefix, run_id)

    def poll_once(self, timeout: float = 1.0) -> ResumeOutcome | None:
        """Handle at most one request; commit it once handled (a contended one: once its retry
        is scheduled). Due retries are run by :meth:`serve` / :meth:`run_due_retries`."""
        msg = self.consumer.poll(timeout)
        if msg is None:
            return None
        err = msg.error()
        if err is not None:
            if err.fatal() or err.code() == KafkaError._FATAL:
                # e.g. fenced by another member with this group.instance.id: nothing more works (a
                # fatal error reaches poll() as _FATAL, whose own fatal() may say False)
                raise RunlogError(f"the resume topic's consumer stopped for good: {err.str()}") from \
                    KafkaException(err)
            log.warning("resume topic: %s", err)
            return None
        outcome = self._handle(msg)
        self._commit(msg)
        return outcome

    def _commit(self, msg: Message) -> None:
        """Commit past ``msg``. A commit refused because the group moved on since the poll (a member
        joined, left or replaced this one) or its coordinator is moving
        (:func:`~runlog.schemas._kafka.commit_refused_by_rebalance`) is logged and ignored: a later commit
        covers it, or the partition's owner gets the request again and resumes idempotently.
        Any other commit error raises."""
        try:
            self.consumer.commit(message=msg, asynchronous=False)
        except KafkaException as err:
            if not commit_refused_by_rebalance(err):
                raise
            log.warning("resume request %s[%s]@%s not committed (%s): a later commit covers it, or the "
                        "partition's owner gets it again", msg.topic(), msg.partition(), msg.offset(),
                        err.args[0] if err.args else err)

    def _handle(self, msg: Message) -> ResumeOutcome | None:
        self.metrics.requests.inc()
        try:
            req = self.codec.decode(msg.value(), ResumeRequest)
        except DecodeError as err:
            self._dead_letter(msg, err.reason, err.detail)
            return None
        return self._resume(req.run_id, msg, req.seen_epoch)

    def _resume(self, run_id: str, msg: Message | None,
                seen_epoch: int | None = None) -> ResumeOutcome | None:
        if self.accept is not None and not self.accept(run_id):
            return None
        t0 = time.perf_counter()
        try:
            request = from_headers(msg.headers()) if msg is not None else None  # who asked, traced
            outcome = self.resumer.resume(run_id, seen_epoch=seen_epoch, request=request)
        except UnknownRun as err:
            self._count("unknown_run", t0)
            # a request for a run nobody knows would be redelivered forever: dead-letter it
            if msg is not None:
                self._dead_letter(msg, "unknown_run", str(err))
            else:
                log.warning("retry of %s: %s", run_id, err)
            with contextlib.suppress(redis.RedisError):  # else a sweep asks again, and gets the same
                self.active.remove(run_id)
            return None
        except (redis.RedisError, ProjectionStoreError, LedgerUnavailable, LogUnavailable,
                DeliveryError) as err:
            # Redis or the brokers unreachable past the client's window (a failover, a broker
            # restarting, this process resumed after a long pause, a partition; the effects ledger
            # unreachable while reconciling an effect): the request is handled (its offset committed)
            # and the run retried later, as a contended one is; whatever the attempt appended is in
            # the log and the retry resumes from it
            self._count("error", t0)
            log.warning("resume %s: %s failed (%s); retrying later", run_id,
                        "Kafka" if isinstance(err, (LogUnavailable, DeliveryError)) else "Redis", err)
            self.retries.schedule(run_id, seen_epoch)
            return None
        except BaseException:
            self._count("error", t0)
            raise
        self._count(outcome.result, t0)
        self._settle(outcome, seen_epoch)
        return outcome

    def _retry(self, run_id: str, seen_epoch: int | None) -> ResumeOutcome | None:
        return self._resume(run_id, None, seen_epoch)

    def _pick_up(self, run_id: str) -> ResumeOutcome | None:
        return self._resume(run_id, None)

    def _request(self, run_id: str, reason: str) -> None:
        request_resume(self.settings, run_id, reason, requested_by="sweeper", producer=self.producer,
                       codec=self.codec)

    def _status_on_log(self, run_id: str) -> RunStatus | None:
        """The run's status as the log has it (its stored snapshot plus the log's tail after it); None
        when the log does not hold the run. A log that cannot be read raises: the sweep is skipped."""
        try:
            return self.resumer.load(run_id)[0].status
        except UnknownRun:
            return None

    def _finished(self, run_id: str) -> bool:
        try:
            return self.resumer.load(run_id)[0].status in (RunStatus.COMPLETED, RunStatus.CANCELLED)
        except (LogUnavailable, redis.RedisError) as err:  # parked all the same: a pickup round unparks it
            log.warning("resume %s: its state not read again after parking (%s)", run_id, err)
            return False

    def _count(self, outcome: str, t0: float) -> None:
        self.metrics.resumes.labels(outcome).inc()
        self.metrics.resume_seconds.observe(time.perf_counter() - t0)

    def _settle(self, outcome: ResumeOutcome, seen_epoch: int | None) -> None:
        run_id = outcome.run_id
        if outcome.result == "not_mine":
            self.not_mine += 1
            log.debug("resume %s: not_mine %s", run_id, outcome.detail)
            return
        if outcome.result == "not_served" and outcome.waiting_for is not None:
            self.not_served += 1
            try:
                self.pickup.park(run_id, outcome.waiting_for)
            except (redis.RedisError, ProjectionStoreError) as err:  # parked at the retry instead
                log.warning("resume %s: not parked for %s now (%s); retrying later", run_id,
                            outcome.waiting_for, err)
                self.retries.schedule(run_id, seen_epoch)
            return
        log.info("resume %s: %s %s", run_id, outcome.result, outcome.detail)
        if outcome.result == "contended":
            self.retries.schedule(run_id, seen_epoch)
        else:
            self.retries.forget(run_id)
            if outcome.result in _DONE:
                try:
                    self.active.remove(run_id)
                except redis.RedisError as err:  # Redis cut off right after the resume ended
                    # still listed as active: a sweep requests it once its lease is gone, and that
                    # resume finds the run ended and removes it; this member goes on meanwhile
                    log.warning("resume %s: %s, but not removed from the active runs now (%s)", run_id,
                                outcome.result, err)
                with contextlib.suppress(redis.RedisError):  # else the next pickup round unparks it
                    self.routes.settle([run_id])  # parked meanwhile by a member not serving its version
        self.outcomes.append(outcome)
        if self.on_outcome is not None:
            self.on_outcome(outcome)

    # -- dead letters -----------------------------------------------------------------------------

    def _dead_letter(self, msg: Message, reason: str, detail: str) -> None:
        log.warning("resume request %s[%s]@%s (key %r) dead-lettered: %s: %s", msg.topic(),
                    msg.partition(), msg.offset(), msg.key(), reason, detail)
        self.metrics.dead_letters.labels(reason).inc()
        headers = dead_letter_headers(reason, detail, str(msg.topic()), msg.partition(), msg.offset())
        self.producer.produce(self.topics.dlq, key=msg.key(), value=msg.value(), headers=list(headers))
        if self.producer.flush(30) != 0:
            raise KafkaException(f"dead letter for {msg.topic()}[{msg.partition()}]@{msg.offset()} "
                                 "was not acknowledged")

    def serve(self, *, stop: Callable[[], bool] | None = None, idle_exit_s: float | None = None) -> int:
        """Poll, run due retries and sweep until ``stop()`` is true or nothing arrived for
        ``idle_exit_s`` (and no retry is pending); returns how many resumes ran (``not_mine``
        requests are not counted). ``stop()`` is checked between requests: the one in hand is
        finished and committed first (``runlog resumer`` sets it on SIGTERM)."""
        handled = 0
        idle_since = time.monotonic()
        interval = self.settings.sweep_interval_ms / 1000.0
        while stop is None or not stop():
            now = time.monotonic()
            if interval > 0 and now - self._last_sweep >= interval:
                self._last_sweep = now
                try:
                    self.sweeper.sweep_if_turn()
                except (redis.RedisError, ProjectionStoreError, LogUnavailable, DeliveryError) as err:
                    log.warning("sweep skipped (%s); the next sweep asks again", err)  # a pause, a failover
            try:
                self.timers.tick()
            except (redis.RedisError, ProjectionStoreError, LogUnavailable, DeliveryError) as err:
                log.warning("timers not looked at (%s); the next turn asks again", err)
            try:
                if not self._declared:
                    for declared in self.app.schedules:  # the App's own schedules, on the log
                        self.schedules.declare(declared)
                    self._declared = True
                self.ticker.tick()
            except (AuthenticationFailed, ConfigError):
                raise  # credentials or settings refused: waiting for the next turn changes nothing
            except (redis.RedisError, RunlogError, KafkaException) as err:
                log.warning("schedules not ticked (%s); the next turn asks again", err)
            retried = self.retries.run_due()
            if time.monotonic() - self._last_pickup >= PICKUP_S:
                self._last_pickup = time.monotonic()
                try:
                    retried += self.pickup.pick_up_parked()
                    self.open_runs.refresh()  # at most every OPEN_RUNS_S
                except (redis.RedisError, ProjectionStoreError) as err:
                    log.warning("parked runs not picked up (%s); the next round tries again", err)
            if retried:
                handled += len(retried)
                idle_since = time.monotonic()
            if stop is not None and stop():  # asked to stop meanwhile: take no new request
                break
            wait = self.retries.next_in()
            msg_outcome = self.poll_once(0.5 if wait is None else min(0.5, wait))
            if msg_outcome is not None:
                if msg_outcome.result not in NOT_ACTED:
                    handled += 1
                idle_since = time.monotonic()
            elif idle_exit_s is not None and not self.retries.pending \
                    and time.monotonic() - idle_since > idle_exit_s:
                break
        return handled

    # -- the parts' work, as the serving loop does it ---------------------------------------------

    def run_due_retries(self) -> list[ResumeOutcome]:
        """Resume every contended run whose retry is due; their outcomes (:attr:`retries`)."""
        return self.retries.run_due()

    def next_retry_in(self) -> float | None:
        """Seconds until the next contended run's retry is due (0 when overdue); None when none is."""
        return self.retries.next_in()

    def sweep(self) -> SweepReport:
        """Request the resume of this App's runs whose lease expired, now (:attr:`sweeper`)."""
        return self.sweeper.sweep()

    def sweep_if_turn(self) -> SweepReport | None:
        """:meth:`sweep` when this member holds the group's sweep turn; None when another member
        swept this interval."""
        return self.sweeper.sweep_if_turn()

    def pick_up_parked(self, limit: int = 100) -> list[ResumeOutcome]:
        """Claim and resume the runs parked for the versions this member serves (:attr:`pickup`)."""
        return self.pickup.pick_up_parked(limit)
