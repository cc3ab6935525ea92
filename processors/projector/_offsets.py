"""The projector's boundary with its consumer group: it never acknowledges past a record it did not apply.

Faust acknowledges a record once the agent's batch that holds it returned, and commits the highest
offset below which every record was acknowledged, *counting as acknowledged the offsets its fetcher
never delivered* (its "gaps", meant for transaction markers and compacted records). Across a
rebalance the fetcher can skip records: the records it had read but not delivered are dropped when
the partitions are revoked, and when the seek back to the committed offset fails (``exception
performing seek when flow not active IllegalStateError: No current assignment for partition``, a
race in aiokafka), the fetcher goes on from where it had read, or drops the re-read records as
already seen; the offsets in between become a gap, and the next commit passes them. The events in
there never reached Redis, and the group's committed offsets say they did: a fresh projector does
not repair them (issue 24).

:class:`OffsetGuard` closes that boundary in the projector itself, whatever the consumer below it
does. Per partition it keeps the next offset whose record must be applied: on the first batch of a
partition after an assignment, the group's committed offset (read from the broker, the low
watermark when none is committed); then one past the last record applied. A batch whose first
record of a partition lies beyond that offset had records skipped: they are read from the log
(a never-committing :class:`~runlog.projections.log_reader.LogReader`) and applied first, in order, and
then acknowledged to Faust with the batch, so its commits go on. Records below the offset are
redeliveries, which the fold ignores. So every offset the group commits was applied, by induction
over the members: each applies everything from the committed offset it started at.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from runlog.projections.batch import RawRecord, Received
from runlog.schemas.settings import Settings

__all__ = ["LogGaps", "OffsetGuard", "kafka_committed"]

log = logging.getLogger("runlog.projector")

Committed = Callable[[list[int]], Mapping[int, int]]
"""partitions -> the next offset to apply of each (the group's committed offset, else the low watermark)."""

Read = Callable[[int, int, int], list[RawRecord]]
"""(partition, start, end) -> the records at offsets ``start`` <= offset < ``end``, in order."""


class OffsetGuard:
    """Per partition, the next offset the projector must apply; fills what the consumer skipped.

    Thread-safe: the rebalance callbacks run on the event loop, the batches in a worker thread.
    """

    def __init__(self, committed: Committed, read: Read) -> None:
        self._committed = committed
        self._read = read
        self._next: dict[int, int] = {}
        self._lock = threading.Lock()
        self.filled = 0
        """Records read from the log because the consumer skipped them (a counter for tests and logs)."""

    def forget(self, partitions: Iterable[int]) -> None:
        """Partitions assigned or revoked: their next offset is learnt again from the group's commits."""
        with self._lock:
            for p in partitions:
                self._next.pop(p, None)

    def learn(self, partitions: Iterable[int]) -> None:
        """Read the group's commits of the partitions whose next offset is not known yet (no batch of
        theirs since they were assigned), as the first batch of each would."""
        with self._lock:
            unknown = [p for p in partitions if p not in self._next]
        if unknown:
            learnt = self._committed(unknown)
            with self._lock:
                for p in unknown:
                    self._next.setdefault(p, learnt[p])

    def read(self, partition: int, start: int, end: int) -> list[RawRecord]:
        """The records of ``partition`` at ``start`` <= offset < ``end``, from the log."""
        return self._read(partition, start, end)

    def next_offsets(self) -> dict[int, int]:
        with self._lock:
            return dict(self._next)

    def complete(self, records: Sequence[RawRecord]) -> tuple[list[RawRecord], list[RawRecord]]:
        """``records`` with every record skipped before them put in place (each partition in offset
        order), and the records that were filled in."""
        parts: dict[int, list[RawRecord]] = {}
        for r in records:
            parts.setdefault(r.partition, []).append(r)
        self.learn(parts)
        with self._lock:
            nxt = {p: self._next[p] for p in parts}
        filled: list[RawRecord] = []
        out: list[RawRecord] = []
        for p, recs in parts.items():
            expect = nxt[p]
            for r in recs:
                if r.offset > expect:
                    gap = self._read(p, expect, r.offset)
                    log.warning("partition %d: records %d..%d were skipped by the consumer; read %d of "
                                "them from the log and applied them first", p, expect, r.offset - 1, len(gap))
                    filled.extend(gap)
                    out.extend(gap)
                out.append(r)
                expect = max(expect, r.offset + 1)
        self.filled += len(filled)
        return out, filled

    def applied(self, records: Sequence[RawRecord]) -> None:
        """The batch (as :meth:`complete` returned it) is in Redis: move each partition past it."""
        last: dict[int, int] = {}
        for r in records:
            last[r.partition] = max(last.get(r.partition, -1), r.offset)
        with self._lock:
            for p, off in last.items():
                self._next[p] = max(self._next.get(p, 0), off + 1)


def kafka_committed(settings: Settings, group: str, topic: str) -> tuple[Committed, Callable[[], None]]:
    """A :data:`Committed` reading the group's offsets from the broker (without joining the group),
    and a function that closes its client."""
    from confluent_kafka import Consumer, TopicPartition

    client: list[Any] = []

    def consumer() -> Any:
        if not client:
            # a consumer that never subscribes: it fetches the group's offsets and joins nothing
            client.append(Consumer(settings.consumer_config(group, **{"enable.auto.commit": False})))
        return client[0]

    def committed(partitions: list[int]) -> dict[int, int]:
        c = consumer()
        got = c.committed([TopicPartition(topic, p) for p in partitions], timeout=30)
        out: dict[int, int] = {}
        for tp in got:
            if tp.error is not None:
                raise RuntimeError(f"reading the committed offset of {topic}[{tp.partition}]: {tp.error}")
            if tp.offset >= 0:
                out[tp.partition] = tp.offset
            else:  # nothing committed: the group starts at the earliest record
                low, _ = c.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=30)
                out[tp.partition] = max(low, 0)
        return out

    def close() -> None:
        if client:
            client.pop().close()

    return committed, close


class LogGaps:
    """Reads what the projector missed, with one never-committing reader (made on first use): a range
    of a partition (:meth:`range`, a :data:`Read`) or one run's events from an offset (:meth:`run`,
    the heal of :class:`~runlog.projections.batch.BatchProjector`)."""

    def __init__(self, settings: Settings, topic: str) -> None:
        self.settings = settings
        self.topic = topic
        self._reader: Any = None

    def _get(self) -> Any:
        if self._reader is None:
            from runlog.projections.log_reader import LogReader

            self._reader = LogReader(self.settings, self.topic, name="runlog-projector-gap")
        return self._reader

    def range(self, partition: int, start: int, end: int) -> list[RawRecord]:
        out: list[RawRecord] = []
        for batch in self._get().batches({partition: (start, end)}):
            out.extend(RawRecord(str(m.topic()), m.partition(), m.offset(), m.key(), m.value())
                       for m in batch)
        return out

    def run(self, run_id: str, partition: int, from_offset: int) -> list[Received]:
        return [(ev, (partition, off), h)
                for off, ev, h in self._get().run_records(run_id, partition, from_offset)]

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
