"""The event log port: what a :class:`~runlog.producers.log._session.RunSession` appends through.

:class:`~runlog.producers.log._writer.RunWriter` is the Kafka adapter (idempotent producer,
``acks=all``); :class:`~runlog.producers.log._memory.InMemoryEventLog` is the in-memory one.
Both pass ``tests/unit/producers/eventlog_contract.py``.

Delivery semantics every adapter keeps: a run's events are stored in produce order,
each delivery report is ``(None, partition, offset)`` with offsets growing per
partition, a failed delivery is reported as ``(DeliveryError, -1, -1)`` and never
dropped silently.
"""

from __future__ import annotations

import abc
import asyncio
import functools
import threading
from collections.abc import Callable

from runlog.producers.base._envelope import TextSealer, text_sealer
from runlog.schemas import RunEvent
from runlog.schemas.errors import DeliveryError
from runlog.schemas.internal import TraceContext
from runlog.schemas.settings import Settings

__all__ = ["DeliveryCallback", "EventLog"]

DeliveryCallback = Callable[[DeliveryError | None, int, int], None]
"""``(error or None, partition, offset)``."""


class EventLog(abc.ABC):
    """Appends encoded run events, keyed by run id; thread-safe, shared by many sessions."""

    settings: Settings
    """Broker and topic prefix."""
    topic: str
    """The events topic (named in :class:`~runlog.schemas.errors.DeliveryError` s)."""
    writer_id: str
    """Recorded in ``RUN_STARTED`` / ``LEASE_ACQUIRED`` attributes."""
    delivery_timeout_s: float
    """How long a record may take before its delivery is reported failed."""

    @functools.cached_property
    def texts(self) -> TextSealer | None:
        """Seals the free text of the events its sessions append (error messages, operator reasons) under
        the run's subject's key when ``RUNLOG_ENCRYPTION`` is on (:mod:`runlog.producers.base._envelope`);
        None when it is off."""
        return text_sealer(self.settings)

    @abc.abstractmethod
    def produce(self, event: RunEvent, on_delivery: DeliveryCallback,
                trace: TraceContext | None = None) -> str:
        """Append one event; ``on_delivery`` is called once, when it is stored or has failed.
        ``trace``: the W3C trace context the record carries (Kafka: ``traceparent`` headers).

        Returns:
            The event's hash, ``runlog.schemas.event_hash(event, body)`` with the Avro body of the very
            bytes produced (:func:`runlog.schemas._codec.body_of`): the run's next ``prev_hash``.
        """

    @abc.abstractmethod
    def send_now(self, done: threading.Event, timeout: float) -> bool:
        """Push what is queued out now, until ``done`` is set; whether it was within ``timeout`` s."""

    @abc.abstractmethod
    def request_resume(self, run_id: str, reason: str, timeout: float = 30.0, *,
                       seen_epoch: int | None = None) -> None:
        """Ask the resumers to resume ``run_id`` (acknowledged before returning). ``seen_epoch``: the
        run's epoch the caller saw or wrote at; a resumer finding a later one does nothing.

        Raises:
            DeliveryError: the request was not stored.
        """

    async def arequest_resume(self, run_id: str, reason: str, timeout: float = 30.0) -> None:
        """:meth:`request_resume` off the loop (a rare path: a keyed start interrupted by a crash)."""
        await asyncio.to_thread(self.request_resume, run_id, reason, timeout)

    async def asend_now(self, done: asyncio.Future[None], timeout: float) -> bool:
        """:meth:`send_now` for an awaiting append: push what is queued out until ``done`` (a future
        the delivery report completes on the caller's loop) is done; whether it was within ``timeout``."""
        try:
            await asyncio.wait_for(asyncio.shield(done), timeout)
        except TimeoutError:
            return False
        return True

    @abc.abstractmethod
    def close(self, timeout: float = 30.0) -> None:
        """Deliver everything still queued, then stop."""
