"""One writer's hold on one run: gapless seq, the lease epoch on every event, confirmation.

Delivery semantics: see :mod:`producers.log._writer`. A session assigns ``seq`` and
produces under one lock, so produce order is seq order and, with the idempotent
producer on one partition, log order is seq order. Before every append the
lease is checked (:class:`~schemas.errors.LeaseLost` stops the writer); after a
failed delivery every further append raises the
:class:`~schemas.errors.DeliveryError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from producers.crash import crash_point, event_subject, kill_self
from producers.define._inputs import InputSource, PinnedInputs
from producers.log._log import EventLog
from producers.run._lease import Lease, LeaseManager
from producers.run._protocol import IO, Steps, drive
from schemas._hash import HASH_VERSION
from schemas._tracecontext import TraceContext, current
from schemas._types import EventType, RunEvent, now_ms
from schemas.errors import DeliveryError

if TYPE_CHECKING:
    from producers.calls._call_budget import BudgetGuard
    from producers.define._workflow import Workflow
    from producers.run._trace import Span

__all__ = ["AppendResult", "RunSession"]


@dataclasses.dataclass(frozen=True, slots=True)
class AppendResult:
    """An event as appended; ``partition``/``offset`` are known once confirmed (else -1); ``hash``:
    its hash from the bytes produced (the fold's ``content_hash``, the next event's ``prev_hash``)."""

    event: RunEvent
    partition: int = -1
    offset: int = -1
    hash: str | None = None


class _Ack:
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
        self.budget: BudgetGuard | None = None
        """The run's budget, checked before each model call it makes (``producers.Budget``)."""
        self.last_hash = last_hash
        """``event_hash`` of the run's last event, from the bytes the writer produced (version 2):
        the next one's ``prev_hash`` (None before seq 1)."""
        self._lock = threading.Lock()
        self._cond = threading.Condition()
        self._outstanding = 0
        self._flushers: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._error: DeliveryError | None = None
        self.closed = False
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
                  params: Mapping[str, Any], last_epoch: int = 0, force: bool = False,
                  attributes: Mapping[str, str] | None = None, last_hash: str | None = None) -> RunSession:
        """Take an existing run's lease at a new epoch and append a confirmed ``LEASE_ACQUIRED``.

        Args:
            last_seq: the run's last accepted seq (from the fold); ``LEASE_ACQUIRED``
                gets ``last_seq + 1``.
            last_epoch: the highest epoch seen on the log; the new one is higher.
            force: take the lease even if another writer holds it (that writer gets
                ``LeaseLost`` at its next heartbeat, and its later events are fenced).
            last_hash: ``RunState.last_hash`` from the fold: ``LEASE_ACQUIRED`` carries it as
                ``prev_hash``, continuing the run's hash chain.

        Raises:
            producers.LeaseHeld: another writer holds the lease and ``force`` is false.
        """
        return drive(cls.take_over_steps(writer, leases, run_id, last_seq=last_seq, workflow=workflow,
                                         input_versions=input_versions, source=source, params=params,
                                         last_epoch=last_epoch, force=force, attributes=attributes,
                                         last_hash=last_hash))

    @classmethod
    def take_over_steps(cls, writer: EventLog, leases: LeaseManager, run_id: str, *, last_seq: int,
                        workflow: Workflow, input_versions: Mapping[str, str], source: InputSource,
                        params: Mapping[str, Any], last_epoch: int = 0, force: bool = False,
                        attributes: Mapping[str, str] | None = None,
                        last_hash: str | None = None) -> Steps[RunSession]:
        """:meth:`take_over` as protocol steps (driven sync or async, :mod:`producers.run._protocol`)."""
        lease: Lease = yield IO(leases, "acquire", "aacquire", (run_id,),
                                {"force": force, "min_epoch": last_epoch + 1})
        s = cls(writer, lease, run_id=run_id, next_seq=last_seq + 1, workflow=workflow,
                inputs=PinnedInputs(source, input_versions), params=params, last_hash=last_hash)
        attrs = {"writer": writer.writer_id, "holder": lease.holder, **(attributes or {})}
        yield s.appending(EventType.LEASE_ACQUIRED, confirm=True, attributes=attrs)
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

    def appending(self, type: EventType, *, confirm: bool = False, **fields: Any) -> IO:
        """The protocol step of :meth:`append` / :meth:`aappend`."""
        return IO(self, "append", "aappend", (type,), {"confirm": confirm, **fields})

    def append(self, type: EventType, *, confirm: bool = False, **fields: Any) -> AppendResult:
        """Append one event (``run_id``, ``seq``, ``epoch``, ``occurred_at`` filled in).

        Args:
            confirm: wait for the broker's acknowledgement before returning.
            **fields: any other ``RunEvent`` field.

        Raises:
            LeaseLost: before anything is produced, if the lease is gone.
            DeliveryError: a delivery of this run failed (now or earlier).
        """
        ack, event, hashed, crash_after = self._produce(type, fields)
        if confirm:
            self._wait(ack, event)
        if crash_after:
            self.crash()
        return AppendResult(event, ack.partition, ack.offset, hashed)

    async def aappend(self, type: EventType, *, confirm: bool = False, **fields: Any) -> AppendResult:
        """:meth:`append`, awaiting the acknowledgement of a confirmed append on the running loop."""
        ack, event, hashed, crash_after = self._produce(type, fields)
        if confirm:
            await self._await(ack, event)
        if crash_after:
            await self.acrash()
        return AppendResult(event, ack.partition, ack.offset, hashed)

    def _produce(self, type: EventType, fields: dict[str, Any]) -> tuple[_Ack, RunEvent, str, bool]:
        ack = _Ack()
        with self._lock:
            self.check()
            event = RunEvent(run_id=self.run_id, seq=self.next_seq, epoch=self.epoch, type=type,
                             occurred_at=now_ms(), prev_hash=self.last_hash, hash_version=HASH_VERSION,
                             **fields)
            subject = f"{type.value}:{event_subject(event.stage, event.call_id)}"
            if crash_point(f"before:{subject}"):
                self.crash()
            with self._cond:
                self._outstanding += 1
            try:
                hashed = self.writer.produce(event, lambda err, p, o: self._delivered(ack, err, p, o),
                                             self.trace)
            except BaseException:
                with self._cond:
                    self._outstanding -= 1
                raise
            self.next_seq += 1
            self.last_hash = hashed  # from the bytes produced: no second walk of the event
        return ack, event, hashed, crash_point(f"after:{subject}")

    def crash_point(self, point: str) -> None:
        """Crash here if ``point`` (e.g. ``inside:STAGE:draft``) is the armed crash point."""
        if crash_point(point):
            self.crash()

    async def acrash_point(self, point: str) -> None:
        """:meth:`crash_point` on the loop."""
        if crash_point(point):
            await self.acrash()

    def crashing(self, point: str) -> IO:
        """The protocol step of :meth:`crash_point`."""
        return IO(self, "crash_point", "acrash_point", (point,))

    def crash(self) -> None:
        """Fault tests: wait for every produced event of this run, then SIGKILL the process."""
        with contextlib.suppress(DeliveryError):
            self.flush()
        kill_self()

    async def acrash(self) -> None:
        with contextlib.suppress(DeliveryError):
            await self.aflush()
        kill_self()

    def _delivered(self, ack: _Ack, err: DeliveryError | None, partition: int, offset: int) -> None:
        ack.error, ack.partition, ack.offset = err, partition, offset
        with self._cond:
            if err is not None and self._error is None:
                self._error = err
            self._outstanding -= 1
            self._cond.notify_all()
            flushers = self._flushers if self._outstanding == 0 else []
            if flushers:
                self._flushers = []
        ack.done.set()
        waiter = ack.waiter
        if waiter is not None:
            waiter[0].call_soon_threadsafe(_wake, waiter[1])
        for loop, fut in flushers:
            loop.call_soon_threadsafe(_wake, fut)

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
        with self._cond:
            if not self._cond.wait_for(lambda: self._outstanding == 0, limit):
                raise DeliveryError(self.writer.topic, self.run_id,
                                    f"{self._outstanding} events not acknowledged within {limit}s")
            if self._error is not None:
                raise self._error

    async def aflush(self, timeout: float | None = None) -> None:
        """:meth:`flush` without blocking the running loop."""
        limit = self._timeout() if timeout is None else timeout
        with self._cond:
            if self._outstanding == 0:
                fut = None
            else:
                loop = asyncio.get_running_loop()
                fut = loop.create_future()
                self._flushers.append((loop, fut))
        if fut is not None:
            try:
                await asyncio.wait_for(fut, limit)
            except TimeoutError:
                raise DeliveryError(self.writer.topic, self.run_id,
                                    f"{self._outstanding} events not acknowledged within {limit}s") from None
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

    def closing(self, *, release: bool = True) -> IO:
        """The protocol step of :meth:`close`."""
        return IO(self, "close", "aclose", (), {"release": release})

    def flushing(self) -> IO:
        """The protocol step of :meth:`flush`."""
        return IO(self, "flush", "aflush")
