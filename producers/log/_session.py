"""One writer's hold on one run: gapless seq, the lease epoch on every event, confirmation.

Delivery semantics: see :mod:`runlog.producers.log._writer`. A session assigns ``seq`` and
produces under one lock, so produce order is seq order and, with the idempotent
producer on one partition, log order is seq order. Before every append the
lease is checked (:class:`~runlog.schemas.errors.LeaseLost` stops the writer); after a
failed delivery every further append raises the
:class:`~runlog.schemas.errors.DeliveryError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from runlog.producers.base._protocol import IO, Steps, drive, io
from runlog.producers.crash import armed, crash_point, event_subject, kill_self
from runlog.producers.define._inputs import InputSource, PinnedInputs
from runlog.producers.log._lease import Lease, LeaseManager
from runlog.producers.log._log import EventLog
from runlog.producers.log._new_event import constructor, new_event
from runlog.schemas import DeliveryError, EventType, RunEvent, Usage, now_ms
from runlog.schemas.internal import HASH_VERSION, TraceContext, current

if TYPE_CHECKING:
    from runlog.producers.base._trace import Span
    from runlog.producers.define._workflow import Workflow

__all__ = ["AppendResult", "RunSession", "SpendGuard"]


_TEXT_FIELDS = frozenset({"error", "attributes", "verification"})
"""The event fields that may carry free text to seal (:meth:`TextSealer.seal_fields`)."""

class SpendGuard(Protocol):
    """What a session carries for its run's tool calls to check (the calls' ``BudgetGuard``); the session
    only holds it."""

    def exceeded(self) -> str | None: ...

    def add(self, usage: Usage) -> str | None: ...


@dataclasses.dataclass(frozen=True, slots=True)
class AppendResult:
    """An event as appended; ``partition``/``offset`` are known once confirmed (else -1); ``hash``:
    its hash from the bytes produced (the fold's ``content_hash``, the next event's ``prev_hash``)."""

    event: RunEvent
    partition: int = -1
    offset: int = -1
    hash: str | None = None


_result: Callable[..., AppendResult] = constructor(AppendResult)
"""``AppendResult(...)`` without ``object.__setattr__`` per field (:mod:`runlog.producers.log._new_event`)."""


class _Ack:
    """The delivery report of one confirmed append (an unconfirmed one has none: it is counted)."""

    __slots__ = ("done", "error", "offset", "partition", "waiter")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: DeliveryError | None = None
        self.partition = -1
        self.offset = -1
        self.waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
        """Set by an awaiting append: the delivery report wakes this future on its loop."""


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class RunSession:
    """The state a writer needs to append to one run it holds the lease of.

    Build one with :meth:`start` (a new run; the runner does this) or
    :meth:`take_over` (an existing run, for resume). Attributes are read-only
    by convention: ``run_id``, ``epoch``, ``next_seq``, ``workflow``, ``inputs``
    (pinned), ``params``.
    """

    def __init__(self, writer: EventLog, lease: Lease, *, run_id: str, next_seq: int,
                 workflow: Workflow, inputs: PinnedInputs, params: Mapping[str, Any],
                 last_hash: str | None = None) -> None:
        self.writer = writer
        self.lease = lease
        self.run_id = run_id
        self.epoch = lease.epoch
        self.next_seq = next_seq
        self.workflow = workflow
        self.inputs = inputs
        self.params: dict[str, Any] = dict(params)
        self.budget: SpendGuard | None = None
        """The run's budget, checked before each model call it makes (``runlog.producers.Budget``)."""
        self.last_hash = last_hash
        """``event_hash`` of the run's last event, from the bytes the writer produced (version 2):
        the next one's ``prev_hash`` (None before seq 1)."""
        self._lock = threading.Lock()
        self._produced = 0
        """Events handed to the writer (under ``_lock``; one taken back when its produce raised)."""
        self._reported = 0
        """Delivery reports received (under ``_ack_lock``): a flush waits until it reaches its target."""
        self._ack_lock = threading.Lock()
        self._waiters: list[tuple[int, Callable[[], object]]] = []
        """Flushes waiting: (the count of reports they wait for, how to wake them)."""
        self._report = self._on_report
        """One delivery callback for every unconfirmed append (no per-append object)."""
        self._error: DeliveryError | None = None
        self.closed = False
        self.subject: str | None = None
        """The subject whose data key seals the run's payloads (``RUN_STARTED`` attribute
        ``runlog.subject``): the runners write through ``store.for_subject(session.subject)``, and the
        free text of its events (error messages, operator reasons) is sealed for it."""
        self.seal_texts = True
        """Seal the free text of its events when the writer seals (``EventLog.texts``); off only for the
        erase's own record (its subject's key is gone; who erased and why stay readable)."""
        self.parent: tuple[str, str] | None = None
        """For a child run (``ctx.start_child``): its parent's run id and the parent's call that
        started it; the run's end asks for the parent's resume (the parent waits for it)."""
        self.trace: TraceContext | None = current()
        """The W3C trace context its events carry (``traceparent`` headers): the run span's once the
        runner opened one, else the one current where the session was made (a resume's, an
        operator's), else None (no headers)."""
        self.run_span: Span | None = None
        """The run span the start opened (its context is in ``RUN_STARTED``), ended by the execution
        that takes it, or by :meth:`close` when the run is never executed."""

    # -- building ---------------------------------------------------------------------------

    @classmethod
    def take_over(cls, writer: EventLog, leases: LeaseManager, run_id: str, *, last_seq: int,
                  workflow: Workflow, input_versions: Mapping[str, str], source: InputSource,
                  params: Mapping[str, Any], epoch: int = 0, force: bool = False,
                  attributes: Mapping[str, str] | None = None, last_hash: str | None = None,
                  subject: str | None = None, seal_texts: bool = True) -> RunSession:
        """Take an existing run's lease at a new epoch and append a confirmed ``LEASE_ACQUIRED``.

        Args:
            last_seq: the run's last accepted seq (from the fold); ``LEASE_ACQUIRED``
                gets ``last_seq + 1``.
            epoch: the run's epoch as the log records it (from the fold); the lease's is higher.
            force: take the lease even if another writer holds it (that writer gets
                ``LeaseLost`` at its next heartbeat, and its later events are fenced).
            last_hash: ``RunState.last_hash`` from the fold: ``LEASE_ACQUIRED`` carries it as
                ``prev_hash``, continuing the run's hash chain.
            subject: the run's subject (``RunState.subject``): its key seals the free text of the
                session's events, ``LEASE_ACQUIRED``'s operator reason the first.
            seal_texts: see :attr:`seal_texts`.

        Raises:
            LeaseHeld: another writer holds the lease and ``force`` is false.
        """
        lease = leases.acquire(run_id, force=force, epoch=epoch)
        return drive(cls.taking_over(writer, lease, run_id, last_seq=last_seq, workflow=workflow,
                                     inputs=PinnedInputs(source, input_versions), params=params,
                                     attributes=attributes, last_hash=last_hash, subject=subject,
                                     seal_texts=seal_texts))

    @classmethod
    def taking_over(cls, writer: EventLog, lease: Lease, run_id: str, *, last_seq: int, workflow: Workflow,
                    inputs: PinnedInputs, params: Mapping[str, Any],
                    attributes: Mapping[str, str] | None = None,
                    last_hash: str | None = None, subject: str | None = None,
                    seal_texts: bool = True) -> Steps[RunSession]:
        """The session of a run whose ``lease`` was just taken at a new epoch, once its confirmed
        ``LEASE_ACQUIRED`` is appended (protocol steps, :mod:`runlog.producers.base._protocol`)."""
        s = cls(writer, lease, run_id=run_id, next_seq=last_seq + 1, workflow=workflow, inputs=inputs,
                params=params, last_hash=last_hash)
        s.subject = subject
        s.seal_texts = seal_texts
        attrs = {"writer": writer.writer_id, "holder": lease.holder, **(attributes or {})}
        yield from s.appending(EventType.LEASE_ACQUIRED, confirm=True, attributes=attrs)
        return s

    # -- appending --------------------------------------------------------------------------

    @property
    def last_seq(self) -> int:
        return self.next_seq - 1

    def check(self) -> None:
        """Raise DeliveryError after a failed delivery, LeaseLost when the lease is gone."""
        if self._error is not None:
            raise self._error
        self.lease.check()

    def appending(self, type: EventType, *, confirm: bool = False, **fields: Any) -> IO[AppendResult]:
        """The protocol step of :meth:`append` / :meth:`aappend`."""
        return io(self.append, self.aappend, type, confirm=confirm, **fields)

    def append(self, type: EventType, *, confirm: bool = False, **fields: Any) -> AppendResult:
        """Append one event (``run_id``, ``seq``, ``epoch``, ``occurred_at`` filled in).

        Args:
            confirm: wait for the broker's acknowledgement before returning.
            **fields: any other ``RunEvent`` field.

        Raises:
            LeaseLost: before anything is produced, if the lease is gone.
            DeliveryError: a delivery of this run failed (now or earlier).
        """
        ack, event, hashed, crash_after = self._produce(type, fields, confirm)
        if ack is not None:
            self._wait(ack, event)
        if crash_after:
            self.crash()
        return _result(event, -1, -1, hashed) if ack is None else \
            _result(event, ack.partition, ack.offset, hashed)

    async def aappend(self, type: EventType, *, confirm: bool = False, **fields: Any) -> AppendResult:
        """:meth:`append`, awaiting the acknowledgement of a confirmed append on the running loop."""
        ack, event, hashed, crash_after = self._produce(type, fields, confirm)
        if ack is not None:
            await self._await(ack, event)
        if crash_after:
            await self.acrash()
        return _result(event, -1, -1, hashed) if ack is None else \
            _result(event, ack.partition, ack.offset, hashed)

    def _produce(self, type: EventType, fields: dict[str, Any],
                 confirm: bool) -> tuple[_Ack | None, RunEvent, str, bool]:
        ack = _Ack() if confirm else None
        texts = self.writer.texts
        if texts is not None and self.seal_texts and not _TEXT_FIELDS.isdisjoint(fields):
            fields = texts.seal_fields(self.subject, fields)
        with self._lock:
            self.check()
            event = new_event(run_id=self.run_id, seq=self.next_seq, epoch=self.epoch, type=type,
                              occurred_at=now_ms(), prev_hash=self.last_hash, hash_version=HASH_VERSION,
                              **fields)
            subject = None  # the crash points' subject, named only while one is armed (fault tests)
            if armed() is not None:
                subject = f"{type.value}:{event_subject(event.stage, event.call_id)}"
                if crash_point(f"before:{subject}"):
                    self.crash()
            self._produced += 1  # before the produce: its report may come before produce returns
            try:
                hashed = self.writer.produce(event, self._report if ack is None else
                                             lambda err, p, o: self._confirmed(ack, err, p, o), self.trace)
            except BaseException:
                self._produced -= 1
                self._release_waiters()  # a flush that counted it waits for one report less
                raise
            self.next_seq += 1
            self.last_hash = hashed  # from the bytes produced: no second walk of the event
        return ack, event, hashed, subject is not None and crash_point(f"after:{subject}")

    def crash_point(self, point: str) -> None:
        """Crash here if ``point`` (e.g. ``inside:STAGE:draft``) is the armed crash point."""
        if crash_point(point):
            self.crash()

    async def acrash_point(self, point: str) -> None:
        """:meth:`crash_point` on the loop."""
        if crash_point(point):
            await self.acrash()

    def crashing(self, point: str) -> IO[None]:
        """The protocol step of :meth:`crash_point`."""
        return io(self.crash_point, self.acrash_point, point)

    def crash(self) -> None:
        """Fault tests: wait for every produced event of this run, then SIGKILL the process."""
        with contextlib.suppress(DeliveryError):
            self.flush()
        kill_self()

    async def acrash(self) -> None:
        with contextlib.suppress(DeliveryError):
            await self.aflush()
        kill_self()

    def _on_report(self, err: DeliveryError | None, partition: int, offset: int) -> None:
        """Count one delivery report (any thread serving the producer's reports); wake the flushes
        it completes."""
        with self._ack_lock:
            if err is not None and self._error is None:
                self._error = err
            self._reported += 1
            if not self._waiters:
                return
        self._release_waiters()

    def _release_waiters(self) -> None:
        with self._ack_lock:
            reported, produced = self._reported, self._produced
            ready = [w for t, w in self._waiters if reported >= min(t, produced)]
            if ready:
                self._waiters = [(t, w) for t, w in self._waiters if reported < min(t, produced)]
        for wake in ready:
            wake()

    def _confirmed(self, ack: _Ack, err: DeliveryError | None, partition: int, offset: int) -> None:
        ack.error, ack.partition, ack.offset = err, partition, offset
        self._on_report(err, partition, offset)
        ack.done.set()
        waiter = ack.waiter
        if waiter is not None:
            waiter[0].call_soon_threadsafe(_wake, waiter[1])

    def _wait_for(self, wake: Callable[[], object]) -> bool:
        """Register ``wake`` until every event produced so far is reported; False when already so."""
        with self._ack_lock:
            target = self._produced
            if self._reported >= target:
                return False
            self._waiters.append((target, wake))
            return True

    def _drop_waiter(self, wake: Callable[[], object]) -> None:
        with self._ack_lock:
            self._waiters = [(t, w) for t, w in self._waiters if w != wake]

    def _outstanding(self) -> int:
        return max(0, self._produced - self._reported)

    def _timeout(self) -> float:
        return self.writer.delivery_timeout_s + 10

    def _wait(self, ack: _Ack, event: RunEvent) -> None:
        if not self.writer.send_now(ack.done, self._timeout()):
            raise DeliveryError(self.writer.topic, self.run_id, f"seq {event.seq} not acknowledged in time")
        if ack.error is not None:
            raise ack.error

    async def _await(self, ack: _Ack, event: RunEvent) -> None:
        # asend_now even when already reported (then it returns at once): every confirmed append
        # goes through it, as every sync one goes through send_now (the writer's latency metric)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        ack.waiter = (loop, fut)
        if ack.done.is_set():  # reported before the waiter was set: no wake-up comes
            _wake(fut)
        if not await self.writer.asend_now(fut, self._timeout()):
            raise DeliveryError(self.writer.topic, self.run_id,
                                f"seq {event.seq} not acknowledged in time")
        if ack.error is not None:
            raise ack.error

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every event of this run appended so far is acknowledged.

        Raises:
            DeliveryError: one of them was not delivered, or the wait timed out.
        """
        limit = self._timeout() if timeout is None else timeout
        done = threading.Event()
        if self._wait_for(done.set) and not done.wait(limit):
            self._drop_waiter(done.set)
            raise DeliveryError(self.writer.topic, self.run_id,
                                f"{self._outstanding()} events not acknowledged within {limit}s")
        if self._error is not None:
            raise self._error

    async def aflush(self, timeout: float | None = None) -> None:
        """:meth:`flush` without blocking the running loop."""
        limit = self._timeout() if timeout is None else timeout
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            loop.call_soon_threadsafe(_wake, fut)

        if self._wait_for(wake):
            try:
                await asyncio.wait_for(fut, limit)
            except TimeoutError:
                self._drop_waiter(wake)
                left = self._outstanding()
                raise DeliveryError(self.writer.topic, self.run_id,
                                    f"{left} events not acknowledged within {limit}s") from None
        if self._error is not None:
            raise self._error

    def close(self, *, release: bool = True) -> None:
        """Flush, then give the lease up (``release=False`` keeps it to expire)."""
        if self.closed:
            return
        self.closed = True
        self.end_run_span()
        try:
            self.flush()
        finally:
            if release:
                self.lease.release()

    async def aclose(self, *, release: bool = True) -> None:
        """:meth:`close` on the loop."""
        if self.closed:
            return
        self.closed = True
        self.end_run_span()
        try:
            await self.aflush()
        finally:
            if release:
                await self.lease.arelease()

    def end_run_span(self) -> None:
        """End the run span the start opened, unless an execution took it."""
        span, self.run_span = self.run_span, None
        if span is not None:
            span.end()

    def closing(self, *, release: bool = True) -> IO[None]:
        """The protocol step of :meth:`close`."""
        return io(self.close, self.aclose, release=release)

    def flushing(self) -> IO[None]:
        """The protocol step of :meth:`flush`."""
        return io(self.flush, self.aflush)
