"""The resumer consumer: a consumer group on the resume topic, plus a sweeper.

Delivery semantics: at-least-once. A ``ResumeRequest`` is committed only after
its resume returned (completed, blocked, contended or failed); a resumer that
dies mid-resume leaves the request uncommitted, so another member of the group
gets it again. Resuming twice is safe: the lease and the fold's epoch fencing
let exactly one writer continue a run, the other backs off (``contended``).

Requests are keyed by run id, so all requests for one run land on one
partition and are handled by one member at a time; several resumers share the
work up to the partition count.

The sweeper looks at runs the projection shows ``RUNNING`` whose lease key is
gone from Redis (their worker died and the lease expired) and requests their
resume. Undecodable requests, and requests for runs neither Redis nor the log
knows, go to the dead-letter topic with their reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from confluent_kafka import Consumer, KafkaException, Message, Producer

from processors.resume import App, ResumeOutcome, Resumer, UnknownRun
from projections import RedisStore, RunStatus
from schemas import Codec, DecodeError, ResumeRequest, Settings, Topics, now_ms

__all__ = ["ResumerService", "SweepReport", "request_resume"]

log = logging.getLogger("runlog.resumer")


def request_resume(settings: Settings, run_id: str, reason: str, *, requested_by: str = "cli",
                   producer: Producer | None = None, codec: Codec | None = None) -> None:
    """Append a ``ResumeRequest`` for a run to the resume topic (acknowledged before returning)."""
    p = producer or Producer(settings.producer_config())
    value = (codec or Codec()).encode(ResumeRequest(run_id, now_ms(), reason, requested_by))
    errors: list[str] = []
    p.produce(Topics.of(settings).resume, key=run_id.encode(), value=value,
              on_delivery=lambda err, msg: errors.append(str(err)) if err else None)
    if p.flush(30) != 0 or errors:
        from schemas import DeliveryError

        raise DeliveryError(Topics.of(settings).resume, run_id, errors[0] if errors else "flush timed out")


@dataclass
class SweepReport:
    requested: list[str] = field(default_factory=list)
    alive: int = 0


class ResumerService:
    """Consumes resume requests as one member of the resumer group and sweeps for dead runs.

    Args:
        settings: services and names; the group is ``settings.resumer_group``.
        app: the application whose runs this resumer may continue.
        on_outcome: called with every resume's outcome (for progress output and tests).
        accept: when given, requests for runs it refuses are committed without a resume
            (a demo or test resumer that owns only some runs).
    """

    def __init__(self, settings: Settings, app: App, *,
                 on_outcome: Callable[[ResumeOutcome], None] | None = None,
                 accept: Callable[[str], bool] | None = None) -> None:
        self.settings = settings
        self.topics = Topics.of(settings)
        self.codec = Codec(max_record_bytes=settings.max_record_bytes)
        self.resumer = Resumer(settings, app)
        self.projection = RedisStore.from_settings(settings)
        self.redis = redis.Redis.from_url(settings.redis_url, **settings.redis_kwargs())
        self.producer = Producer(settings.producer_config())
        self.consumer = Consumer(settings.consumer_config(
            settings.resumer_group, **{"session.timeout.ms": 10_000, "max.poll.interval.ms": 600_000}))
        self.consumer.subscribe([self.topics.resume])
        self.on_outcome = on_outcome
        self.accept = accept
        self._last_sweep = 0.0
        self.outcomes: list[ResumeOutcome] = []

    def close(self) -> None:
        try:
            self.consumer.close()
        finally:
            self.producer.flush(10)
            self.resumer.close()
            self.redis.close()

    def __enter__(self) -> ResumerService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def poll_once(self, timeout: float = 1.0) -> ResumeOutcome | None:
        """Handle at most one request; commit it once handled."""
        msg = self.consumer.poll(timeout)
        if msg is None:
            return None
        if msg.error() is not None:
            log.warning("resume topic: %s", msg.error())
            return None
        outcome = self._handle(msg)
        self.consumer.commit(message=msg, asynchronous=False)
        return outcome

    def _handle(self, msg: Message) -> ResumeOutcome | None:
        try:
            req = self.codec.decode(msg.value(), ResumeRequest)
        except DecodeError as err:
            self._dead_letter(msg, err.reason, err.detail)
            return None
        if self.accept is not None and not self.accept(req.run_id):
            return None
        try:
            outcome = self.resumer.resume(req.run_id)
        except UnknownRun as err:
            # a request for a run nobody knows would be redelivered forever: dead-letter it
            self._dead_letter(msg, "unknown_run", str(err))
            return None
        log.info("resume %s: %s %s", req.run_id, outcome.result, outcome.detail)
        self.outcomes.append(outcome)
        if self.on_outcome is not None:
            self.on_outcome(outcome)
        return outcome

    def _dead_letter(self, msg: Message, reason: str, detail: str) -> None:
        headers = [
            ("runlog.error.reason", reason.encode()),
            ("runlog.error.detail", detail.encode()[:1000]),
            ("runlog.original.topic", str(msg.topic()).encode()),
            ("runlog.original.partition", str(msg.partition()).encode()),
            ("runlog.original.offset", str(msg.offset()).encode()),
        ]
        self.producer.produce(self.topics.dlq, key=msg.key(), value=msg.value(), headers=headers)
        if self.producer.flush(30) != 0:
            raise KafkaException(f"dead letter for {msg.topic()}[{msg.partition()}]@{msg.offset()} "
                                 "was not acknowledged")

    def sweep(self) -> SweepReport:
        """Request the resume of every RUNNING run whose lease has expired."""
        report = SweepReport()
        for run_id in self.projection.runs(RunStatus.RUNNING):
            if self.redis.exists(f"{self.settings.redis_prefix}:{{{run_id}}}:lease"):
                report.alive += 1
                continue
            request_resume(self.settings, run_id, "lease expired", requested_by="sweeper",
                           producer=self.producer, codec=self.codec)
            report.requested.append(run_id)
        return report

    def serve(self, *, stop: Callable[[], bool] | None = None, idle_exit_s: float | None = None) -> int:
        """Poll and sweep until ``stop()`` is true or nothing arrived for ``idle_exit_s``."""
        handled = 0
        idle_since = time.monotonic()
        interval = self.settings.sweep_interval_ms / 1000.0
        while stop is None or not stop():
            now = time.monotonic()
            if interval > 0 and now - self._last_sweep >= interval:
                self._last_sweep = now
                self.sweep()
            if self.poll_once(0.5) is not None:
                handled += 1
                idle_since = time.monotonic()
            elif idle_exit_s is not None and time.monotonic() - idle_since > idle_exit_s:
                break
        return handled


def describe(outcome: ResumeOutcome) -> dict[str, Any]:
    """An outcome as a JSON-ready dict."""
    return {"run_id": outcome.run_id, "result": outcome.result, "epoch": outcome.epoch,
            "detail": outcome.detail, "plan": outcome.plan.to_dict()}
