"""In-memory adapters of the SDK's ports: event log and lease (tests, one process).

Each passes the same contract test as its real twin (Kafka, Redis), so the Runner, the resume plan
and the determinism guard can be unit tested without services (the in-memory artifact store is beside
its port, :mod:`runlog.producers.calls._artifacts`). Delivery semantics of :class:`InMemoryEventLog`: every
produce is stored and reported at once (no batching, nothing in flight), events
round-trip through the :class:`~runlog.schemas._codec.Codec` so only what Kafka would
carry is stored, a run's events keep produce order on the run's partition.
"""

from __future__ import annotations

import threading
import uuid
from collections import defaultdict
from dataclasses import dataclass

from runlog.producers.log._lease import Lease, LeaseHeld, LeaseManager
from runlog.producers.log._log import DeliveryCallback, EventLog
from runlog.producers.log._runlog import RunLog
from runlog.schemas import Codec, ResumeRequest, RunEvent, event_hash, now_ms
from runlog.schemas.errors import DeliveryError, LeaseLost
from runlog.schemas.internal import TraceContext, body_of
from runlog.schemas.settings import Settings
from runlog.schemas.topics import Topics, partition_for

__all__ = [
    "InMemoryEventLog",
    "InMemoryLease",
    "InMemoryLeaseManager",
    "InMemoryLeaseTable",
    "LoggedEvent",
]


# -- the event log --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoggedEvent:
    """An event as stored, with the position its delivery report gave and its hash from the bytes
    stored (``runlog.schemas.event_hash(event, body)``)."""

    event: RunEvent
    partition: int
    offset: int
    hash: str


class InMemoryEventLog(EventLog, RunLog):
    """The events topic in lists, one per partition; also the :class:`~runlog.producers.log._runlog.RunLog`.

    Args:
        settings: topic prefix and partition count (defaults: ``Settings()``).
        writer_id: recorded in ``RUN_STARTED`` / ``LEASE_ACQUIRED`` attributes.
    """

    def __init__(self, settings: Settings | None = None, *, writer_id: str | None = None,
                 codec: Codec | None = None) -> None:
        self.settings = settings or Settings()
        self.topic = Topics.of(self.settings).events
        self.codec = codec or Codec.from_settings(self.settings, schema_log=False)
        self.writer_id = writer_id or f"writer-{uuid.uuid4().hex[:12]}"
        self.delivery_timeout_s = 1.0
        self.resume_requests: list[ResumeRequest] = []
        self._partitions: dict[int, list[RunEvent]] = defaultdict(list)
        self._by_run: dict[str, list[LoggedEvent]] = defaultdict(list)
        self.traces: dict[tuple[str, int, int], TraceContext] = {}
        """(run id, seq, epoch) -> the trace context an event was produced with (Kafka: its headers)."""
        self._failing: dict[str, str] = {}
        self._lock = threading.Lock()
        self.closed = False

    # -- failure injection

    def fail_run(self, run_id: str, reason: str = "injected delivery failure") -> None:
        """Every later produce of ``run_id`` is reported failed (nothing stored)."""
        with self._lock:
            self._failing[run_id] = reason

    def heal_run(self, run_id: str) -> None:
        """Stop failing ``run_id``'s deliveries."""
        with self._lock:
            self._failing.pop(run_id, None)

    # -- writing

    def partition_of(self, run_id: str) -> int:
        return partition_for(run_id, self.settings.partitions)

    def produce(self, event: RunEvent, on_delivery: DeliveryCallback,
                trace: TraceContext | None = None) -> str:
        if self.closed:
            raise DeliveryError(self.topic, event.run_id, "the event log is closed")
        data = self.codec.encode(event)
        stored = self.codec.decode(data, RunEvent)  # what the broker would carry
        hashed = event_hash(event, body_of(data))
        p = self.partition_of(event.run_id)
        with self._lock:
            reason = self._failing.get(event.run_id)
            if reason is None:
                part = self._partitions[p]
                logged = LoggedEvent(stored, p, len(part), hashed)
                part.append(stored)
                if trace is not None:
                    self.traces[(event.run_id, event.seq, event.epoch)] = trace
                self._by_run[event.run_id].append(logged)
        if reason is not None:
            on_delivery(DeliveryError(self.topic, event.run_id, reason), -1, -1)
        else:
            on_delivery(None, logged.partition, logged.offset)
        return hashed

    def send_now(self, done: threading.Event, timeout: float) -> bool:
        return done.wait(timeout)  # every report was given inside produce

    def request_resume(self, run_id: str, reason: str, timeout: float = 30.0, *,
                       seen_epoch: int | None = None) -> None:
        with self._lock:
            self.resume_requests.append(ResumeRequest(run_id, now_ms(), reason, self.writer_id, seen_epoch))

    def close(self, timeout: float = 30.0) -> None:
        self.closed = True

    # -- reading

    def records(self, run_id: str) -> list[LoggedEvent]:
        """The run's events in log order, with partition and offset."""
        with self._lock:
            return list(self._by_run.get(run_id, ()))

    def events(self, run_id: str) -> list[RunEvent]:
        """The run's events in log order."""
        return [r.event for r in self.records(run_id)]

    def first_event(self, run_id: str) -> RunEvent | None:
        with self._lock:
            found = self._by_run.get(run_id)
            return found[0].event if found else None

    def run_ids(self) -> list[str]:
        """Every run with an event, in order of its first event."""
        with self._lock:
            return list(self._by_run)


# -- the lease ------------------------------------------------------------------------------------


class InMemoryLeaseTable:
    """What Redis holds for leases: an epoch counter and the current ``(holder, epoch)`` per run.

    Share one table between several :class:`InMemoryLeaseManager` s to play several writers.
    Leases do not age on their own: :meth:`expire` is the ttl running out.
    """

    def __init__(self) -> None:
        self.epochs: dict[str, int] = {}
        self.held: dict[str, tuple[str, int]] = {}
        self.lock = threading.Lock()

    def expire(self, run_id: str) -> None:
        """The lease of ``run_id`` expires now (its holder learns it at the next heartbeat)."""
        with self.lock:
            self.held.pop(run_id, None)


class InMemoryLease(Lease):
    """A lease in an :class:`InMemoryLeaseTable`."""

    def __init__(self, manager: InMemoryLeaseManager, run_id: str, epoch: int) -> None:
        self._m = manager
        self.run_id = run_id
        self.epoch = epoch
        self.holder = manager.holder
        self._lost: str | None = None
        self._released = False

    def check(self) -> None:
        if self._lost is not None:
            raise LeaseLost(self.run_id, self.epoch, self._lost)
        if self._released:
            self._lost = "released"
            raise LeaseLost(self.run_id, self.epoch, self._lost)

    def verify(self) -> None:
        self.check()
        if not self.heartbeat():
            raise LeaseLost(self.run_id, self.epoch, self._lost or "taken over")

    def heartbeat(self) -> bool:
        if self._lost is not None or self._released:
            return False
        t = self._m.table
        with t.lock:
            ok = t.held.get(self.run_id) == (self.holder, self.epoch)
        if not ok:
            self._lost = "taken over or expired (the table no longer holds this epoch)"
        return ok

    @property
    def lost(self) -> bool:
        return self._lost is not None

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        t = self._m.table
        with t.lock:
            if t.held.get(self.run_id) == (self.holder, self.epoch):
                del t.held[self.run_id]


class InMemoryLeaseManager(LeaseManager):
    """Hands out leases from a table (its own unless one is shared).

    Args:
        table: shared with other managers to play several writers.
        holder: this writer's name.
    """

    def __init__(self, table: InMemoryLeaseTable | None = None, *, holder: str | None = None) -> None:
        self.table = table or InMemoryLeaseTable()
        self.holder = holder or f"writer-{uuid.uuid4().hex[:12]}"

    def acquire(self, run_id: str, *, force: bool = False, epoch: int = 0) -> InMemoryLease:
        t = self.table
        with t.lock:
            cur = t.held.get(run_id)
            if cur is not None and not force:
                raise LeaseHeld(run_id, f"{cur[0]}|{cur[1]}")
            new = max(t.epochs.get(run_id, 0), epoch) + 1
            t.epochs[run_id] = new
            t.held[run_id] = (self.holder, new)
        return InMemoryLease(self, run_id, new)

    def expire(self, run_id: str) -> None:
        """:meth:`InMemoryLeaseTable.expire`."""
        self.table.expire(run_id)

    def close(self) -> None:
        """Nothing to stop (no heartbeat thread)."""
