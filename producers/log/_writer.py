"""The run writer: one idempotent Kafka producer shared by every run of a process.

Delivery semantics: the producer has ``enable.idempotence=true`` and
``acks=all`` (``Settings.producer_config``), records are keyed by run id, so a
run's events land on one partition in produce order without duplicates from
retries. Appends are pipelined (produce, return); an append marked
``confirm=True`` (every ``EFFECT_INTENT``, ``RUN_STARTED``, ``LEASE_ACQUIRED``)
is sent at once, without waiting out ``linger.ms`` (:meth:`RunWriter.send_now`),
and waits for the broker's acknowledgement before returning, and
:meth:`RunSession.flush` (at every stage end and run end) waits for all of a
run's outstanding events. A failed delivery is never dropped: it is raised as
:class:`~runlog.schemas.errors.DeliveryError` from the next append or flush of that run,
and the session refuses further appends (its seq may have a gap; resume from the
log).

Every record carries the CloudEvents Kafka binding's binary-mode headers
(``ce_specversion``, ``ce_id``, ``ce_source``, ``ce_type``, ``ce_time``,
``ce_subject``, ``content-type``; :mod:`runlog.producers.log._cloudevents`); a producer retry
resends a record with its headers, so every copy of an event has the same ``ce_id``. A record
written while a trace is active also carries ``traceparent`` (and ``tracestate``): a run event
its session's context (:attr:`RunSession.trace`), a resume request the asker's
(:func:`runlog.schemas._tracecontext.current`).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, Message, Producer

from runlog.producers.log._cloudevents import CloudEventHeaders
from runlog.producers.log._log import DeliveryCallback, EventLog
from runlog.schemas import Codec, ResumeRequest, RunEvent, event_hash, now_ms
from runlog.schemas.errors import AuthenticationFailed, DeliveryError
from runlog.schemas.internal import TraceContext, current
from runlog.schemas.settings import Settings
from runlog.schemas.topics import Topics

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from runlog.producers.log._metrics import WriterMetrics

__all__ = ["DeliveryCallback", "RunWriter", "send_resume_request"]


def send_resume_request(producer: Producer, headers: CloudEventHeaders, codec: Codec, request: ResumeRequest,
                        *, topic: str, timeout: float = 30.0,
                        wait: Callable[[threading.Event, float], bool] | None = None,
                        trace: TraceContext | None = None) -> None:
    """Produce ``request`` to the resume topic ``topic`` keyed by its run id, with the CloudEvents
    headers of ``headers`` (the sender's) and the trace context ``trace`` (default: the current one,
    :func:`runlog.schemas._tracecontext.current`), and wait for its acknowledgement.

    ``wait(done, timeout)`` waits for the delivery report (``done`` is set by it) and says whether
    it came; the default flushes the producer.

    Raises:
        DeliveryError: the request was not stored within ``timeout`` seconds.
    """
    data = codec.encode(request)
    done = threading.Event()
    errors: list[str] = []

    def cb(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            errors.append(f"{err.name()}: {err.str()}")
        done.set()

    producer.produce(topic, value=data, key=request.run_id.encode("utf-8"), on_delivery=cb,
                     headers=headers.resume_request(request, data, trace=trace or current()))
    acked = wait(done, timeout) if wait is not None else producer.flush(timeout) == 0 and done.is_set()
    if not acked or errors:
        raise DeliveryError(topic, request.run_id, errors[0] if errors else "resume request not acknowledged")


class RunWriter(EventLog):
    """The Kafka adapter of :class:`~runlog.producers.log._log.EventLog`: produces encoded run events;
    thread-safe, shared by many :class:`RunSession` s.

    Args:
        settings: broker and topic prefix.
        writer_id: recorded in ``RUN_STARTED`` / ``LEASE_ACQUIRED`` attributes.
        producer_overrides: extra librdkafka settings (tests shorten timeouts).
        metrics_registry: a ``prometheus_client.CollectorRegistry`` to count appends, confirmed-append
            latency and delivery failures in (``runlog_writer_*``, :mod:`runlog.producers.log._metrics`); the
            application exposes it. None (the default): no metrics.
    """

    def __init__(self, settings: Settings, *, writer_id: str | None = None, codec: Codec | None = None,
                 producer_overrides: dict[str, Any] | None = None,
                 metrics_registry: CollectorRegistry | None = None) -> None:
        self.settings = settings
        self.topic = Topics.of(settings).events
        self.codec = codec or Codec.from_settings(settings)
        self._body_at = 5 if self.codec.uses_registry else 10
        """Where the codec's framing ends (``00`` + schema id, or ``C3 01`` + fingerprint), as
        :func:`runlog.schemas._codec.body_of` finds it."""
        self.writer_id = writer_id or f"writer-{uuid.uuid4().hex[:12]}"
        self._ce = CloudEventHeaders(self.topic, self.writer_id)
        self._ce_resume = CloudEventHeaders(Topics.of(settings).resume, self.writer_id)
        conf = settings.producer_config(**(producer_overrides or {}))
        self.delivery_timeout_s = float(conf.get("message.timeout.ms", 300_000)) / 1000
        """How long librdkafka tries a record before reporting it failed."""
        self._producer = Producer(conf)
        self.metrics: WriterMetrics | None = None
        if metrics_registry is not None:
            from runlog.producers.log._metrics import WriterMetrics

            self.metrics = WriterMetrics.of(metrics_registry)
        self._stop = threading.Event()
        self._sending_lock = threading.Lock()
        self._sending = 0
        """Threads inside :meth:`send_now`: they serve delivery reports, the poll thread stands aside."""
        self._urgent = 0
        """Appends awaiting their report on a loop (:meth:`asend_now`): the poll thread flushes."""
        self._wake = threading.Event()
        """Set by :meth:`produce` (when the poll thread is idle) and :meth:`asend_now`: the idle poll
        thread wakes at once."""
        self._idle = False
        """The poll thread is about to sleep or sleeping on ``_wake``: only then does a produce set it
        (an ``Event.set`` per append cost a tenth of an append)."""
        self.failure: AuthenticationFailed | None = None
        """The broker refused the credentials (served by the poll thread, which stops then): every later
        append raises it."""
        self._poller = threading.Thread(target=self._poll_loop, name="runlog-writer-poll", daemon=True)
        self._poller.start()

    def _poll_loop(self) -> None:
        try:
            self._serve()
        except AuthenticationFailed as err:  # raised by the error callback (runlog.schemas._kafka_auth)
            self.failure = err

    def _raise_failure(self) -> None:
        if self.failure is not None:
            raise self.failure

    def _serve(self) -> None:
        while not self._stop.is_set():
            if self._sending:
                # a confirmed append is flushing and serves every delivery report meanwhile;
                # polling too would race it for its own report and keep its flush waiting
                self._stop.wait(0.01)
            elif self._urgent:
                self._producer.flush(0.001)  # awaiting appends: send now, serve their reports
            elif len(self._producer):
                # records in flight: short polls, so an append that starts awaiting its report is
                # noticed within a millisecond (librdkafka's poll cannot be woken for it)
                self._producer.poll(0.001)
            else:
                # nothing in flight: sleep until an append comes. Idle is raised before the queue
                # is looked at again, so a produce either is seen here or sees idle and wakes us
                self._idle = True
                if not len(self._producer):
                    self._wake.wait(0.01)
                self._idle = False
                self._wake.clear()

    def produce(self, event: RunEvent, on_delivery: DeliveryCallback,
                trace: TraceContext | None = None) -> str:
        """Encode and produce one event keyed by its run id (blocks while the local queue is full);
        its hash from the bytes produced (:meth:`EventLog.produce`)."""
        data = self.codec.encode(event)
        hashed = event_hash(event, data[self._body_at:])  # the body after the codec's framing
        topic, key, metrics = self.topic, event.run_id, self.metrics
        headers = self._ce.run_event(event, data, trace)
        self._raise_failure()

        def cb(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                if metrics is not None:
                    metrics.failures.labels(err.name()).inc()
                on_delivery(DeliveryError(topic, key, f"{err.name()}: {err.str()}"), -1, -1)
            else:
                on_delivery(None, msg.partition(), msg.offset())

        while True:
            try:
                self._producer.produce(topic, value=data, key=key.encode("utf-8"), on_delivery=cb,
                                       headers=headers)
                if self._idle:
                    self._wake.set()
                if metrics is not None:
                    metrics.appends.inc()
                return hashed
            except BufferError:
                time.sleep(0.01)  # the poll thread drains delivery reports

    def request_resume(self, run_id: str, reason: str, timeout: float = 30.0, *,
                       seen_epoch: int | None = None) -> None:
        """Append a ``ResumeRequest`` for ``run_id`` to the resume topic and wait for its acknowledgement;
        ``seen_epoch``: the run's epoch as the caller last wrote or saw it (a resumer finding a later
        one does nothing)."""
        send_resume_request(self._producer, self._ce_resume, self.codec,
                            ResumeRequest(run_id, now_ms(), reason, self.writer_id, seen_epoch),
                            topic=Topics.of(self.settings).resume, timeout=timeout, wait=self._flush_until)

    def send_now(self, done: threading.Event, timeout: float) -> bool:
        """Send what is queued without waiting out ``linger.ms``, until ``done`` is set.

        librdkafka ignores ``linger.ms`` only while a ``flush()`` is in progress, so
        this flushes in 1 ms slices and stops as soon as ``done`` is set (the delivery
        report of a confirmed append), not when every other run's records are
        acknowledged. Records still go out of the one idempotent producer in produce
        order: per-partition ordering and ``acks=all`` are unchanged; other runs'
        records queued at that moment are sent with it (smaller batches for them).

        Returns:
            whether ``done`` was set within ``timeout`` seconds.
        """
        if self.metrics is None:
            return self._flush_until(done, timeout)
        t0 = time.perf_counter()
        ok = self._flush_until(done, timeout)
        if ok:
            self.metrics.confirmed_sync.observe(time.perf_counter() - t0)
        return ok

    def _flush_until(self, done: threading.Event, timeout: float) -> bool:
        end = time.monotonic() + timeout
        with self._sending_lock:
            self._sending += 1
        try:
            while not done.is_set():
                self._raise_failure()
                left = end - time.monotonic()
                if left <= 0:
                    return done.is_set()
                self._producer.flush(min(left, 0.001))
            return True
        finally:
            with self._sending_lock:
                self._sending -= 1

    async def asend_now(self, done: asyncio.Future[None], timeout: float) -> bool:
        """:meth:`send_now` for an awaiting append: the poll thread flushes (linger bypassed) while
        any append awaits its report, so the loop never blocks and one thread serves them all."""
        t0 = time.perf_counter() if self.metrics is not None else 0.0
        self._raise_failure()
        with self._sending_lock:
            self._urgent += 1
        self._wake.set()
        try:
            async with asyncio.timeout(timeout):
                await done  # completed by the poll thread's report; a timeout cancels it (its owner's)
        except TimeoutError:
            return False
        finally:
            with self._sending_lock:
                self._urgent -= 1
        if self.metrics is not None:
            self.metrics.confirmed_async.observe(time.perf_counter() - t0)
        return True

    def close(self, timeout: float = 30.0) -> None:
        """Deliver everything still queued, then stop the poll thread (at once when the broker refused
        the credentials: nothing queued can be delivered)."""
        remaining = self._producer.flush(0 if self.failure is not None else timeout)
        self._stop.set()
        self._poller.join(timeout=5)
        if remaining:
            raise DeliveryError(self.topic, None, f"{remaining} events not acknowledged within {timeout}s")

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

