"""The one reader of Runlog's topics: a range of offsets, one run's events, or the whole topic.

Delivery semantics: read-only. Each :class:`LogReader` owns a plain confluent-kafka consumer with
a fresh group id that never commits (``enable.auto.commit`` off, nothing calls ``commit``) and is
*assigned* partitions, so it joins no group and moves no live consumer's offsets. A read ends at
offsets fixed before it starts (the high watermarks taken at start, unless a range says
otherwise): records appended meanwhile are not read, so a read always ends.

* :meth:`LogReader.batches` (and :func:`read_range`): partition -> ``(start, end)`` offsets
  (``end`` exclusive), in batches of raw messages, each partition in offset order;
* :meth:`LogReader.run_events` (and :func:`read_run`): one run's events, decoded, with their
  offsets: the run's partition (:func:`runlog.schemas.topics.partition_for`), only records keyed by
  the run id, from an offset to the partition's high watermark at start;
  :meth:`LogReader.run_records` (and :func:`read_run_records`) the same with each event's hash
  computed from its record's bytes as read (``runlog.schemas.event_hash(event, body)``), for folding;
* :meth:`LogReader.topic_ranges` and :func:`read_topic`: every partition from its low watermark
  (or a given offset) to its high watermark at start.

Every watermark is read with :func:`runlog.schemas._kafka.watermarks` (a leader election is waited out).
A read that gets no record for ``stall_s`` seconds while records are still due raises
:class:`~runlog.schemas.errors.RunlogError` (``no progress reading ...``); so does a topic that does not
exist. An optional progress callback is called with ``(records read, records in the range)``;
:func:`progress_bar` draws one on a text stream.

This module loads the Kafka client: :mod:`projections` does not import it eagerly.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import TracebackType
from typing import Any, TextIO

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from runlog.schemas import Codec, RunEvent, event_hash
from runlog.schemas.errors import DecodeError, LogUnavailable, RunlogError
from runlog.schemas.internal import RETRIABLE_METADATA_ERRORS, watermarks
from runlog.schemas.settings import Settings
from runlog.schemas.topics import Topics, partition_for

__all__ = [
    "BATCH",
    "STALL_S",
    "LogReader",
    "Progress",
    "Ranges",
    "progress_bar",
    "read_range",
    "read_run",
    "read_run_records",
    "read_topic",
]

BATCH = 2_000
"""Most messages asked of the client at once."""

STALL_S = 60.0
"""Seconds without a record, while records are still due, before a read gives up."""

Ranges = Mapping[int, tuple[int, int]]
"""partition -> ``(start, end)``: the offsets read, ``end`` exclusive."""

Progress = Callable[[int, int], None]
"""Called with ``(records read so far, records in the range)`` when a read starts and after each
batch. The range's count is an upper bound: transaction markers and compacted records take
offsets but are not read."""


class LogReader:
    """A never-committing reader of one topic (the events topic unless named); a context manager.

    Args:
        settings: the cluster, security and topic prefix.
        topic: the topic read (default: the events topic of ``settings``).
        name: the start of the consumer's throwaway group id (it shows in broker logs).
        stall_s: see :data:`STALL_S`.
        poll_timeout: seconds one poll waits for records.
        timeout: seconds a watermark or metadata request may take, leader elections included.
        fetch_wait_ms: the longest a fetch waits at the broker for records (``fetch.wait.max.ms``;
            the client's default when None). A reader kept open for many short reads sets it low: a
            fetch long-polling at the end of a partition delays the next read's requests.
    """

    def __init__(self, settings: Settings, topic: str | None = None, *, name: str = "runlog-read",
                 stall_s: float = STALL_S, poll_timeout: float = 1.0, timeout: float = 10.0,
                 fetch_wait_ms: int | None = None) -> None:
        self.settings = settings
        self.topic = topic if topic is not None else Topics.of(settings).events
        self.stall_s = stall_s
        self.poll_timeout = poll_timeout
        self.timeout = timeout
        self._c: Any = Consumer(settings.consumer_config(
            f"{name}-{uuid.uuid4().hex[:12]}",
            **{"enable.auto.commit": False, "enable.partition.eof": False,
               "fetch.max.bytes": 52_428_800, "max.partition.fetch.bytes": 10_485_760,
               **({} if fetch_wait_ms is None else {"fetch.wait.max.ms": fetch_wait_ms})}))

    def __enter__(self) -> LogReader:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        if self._c is not None:
            self._c.close()
            self._c = None

    @property
    def consumer(self) -> Any:
        if self._c is None:
            raise RunlogError(f"the reader of {self.topic!r} is closed")
        return self._c

    # -- where to read --------------------------------------------------------------------------

    def watermarks(self, partitions: list[int] | None = None) -> dict[int, tuple[int, int]]:
        """``{partition: (low, high)}`` now (every partition unless given).

        Raises:
            RunlogError: the topic does not exist, or the broker did not answer in ``timeout``.
        """
        return watermarks(self.consumer, self.topic, partitions, timeout=self.timeout)

    def partitions(self) -> list[int]:
        """The topic's partitions, in order."""
        return sorted(self.watermarks())

    def partition_of(self, run_id: str) -> int:
        """The partition Runlog's writers put ``run_id`` on."""
        return partition_for(run_id, len(self.partitions()))

    def offset_at(self, partition: int, timestamp_ms: int) -> int:
        """First offset of ``partition`` with a timestamp >= ``timestamp_ms`` (-1: none)."""
        try:
            found = self.consumer.offsets_for_times(
                [TopicPartition(self.topic, partition, timestamp_ms)], timeout=self.timeout)
        except KafkaException as err:
            raise RunlogError(
                f"looking up offsets by time on {self.topic}[{partition}] failed: {err}") from err
        return int(found[0].offset)

    def topic_ranges(self, from_offsets: Mapping[int, int] | None = None) -> dict[int, tuple[int, int]]:
        """Every partition from its low watermark (or ``from_offsets[p]`` when higher) to its high
        watermark now: the whole topic as it is when this is called."""
        starts = from_offsets or {}
        return {p: (max(lo, starts.get(p, lo)), hi) for p, (lo, hi) in self.watermarks().items()}

    # -- reading --------------------------------------------------------------------------------

    def batches(self, ranges: Ranges, *, progress: Progress | None = None,
                stall_s: float | None = None) -> Iterator[list[Message]]:
        """Batches of messages of ``ranges``, each partition in offset order (partitions interleave).

        Raises:
            RunlogError: the client failed, or no record came for ``stall_s`` (default: the
                reader's) while some were due.
        """
        c, topic = self.consumer, self.topic
        todo = {p: end for p, (start, end) in ranges.items() if end > max(start, 0)}
        total = sum(todo[p] - max(ranges[p][0], 0) for p in todo)
        done = 0
        if progress is not None:
            progress(0, total)
        if not todo:
            return
        c.assign([TopicPartition(topic, p, max(ranges[p][0], 0)) for p in todo])
        limit = self.stall_s if stall_s is None else stall_s
        pos = {p: max(ranges[p][0], 0) for p in todo}
        idle_since = time.monotonic()
        while todo:
            # Ask for no more than what is left, so a short tail returns as soon as it is fetched
            # instead of waiting out the poll timeout for a batch that cannot fill.
            left = sum(todo[p] - pos[p] for p in todo)
            try:
                msgs = c.consume(num_messages=max(1, min(BATCH, left)), timeout=self.poll_timeout)
            except KafkaException as err:
                raise RunlogError(f"consuming {topic!r} failed: {err}") from err
            batch = []
            for m in msgs:
                kerr = m.error()
                if kerr is not None:
                    if kerr.code() == KafkaError._PARTITION_EOF:
                        continue
                    if not kerr.fatal() and kerr.code() in RETRIABLE_METADATA_ERRORS:
                        continue  # the client reconnects by itself; a lasting outage is a stall below
                    raise RunlogError(f"consuming {topic!r} failed: {kerr}")
                p, off = m.partition(), m.offset()
                end = todo.get(p)
                if end is None or off >= end or off < pos[p]:
                    continue  # not in the range (a reused consumer's earlier fetch, say)
                pos[p] = off + 1
                batch.append(m)
                if off >= end - 1:
                    del todo[p]
            self._drop_finished(todo, pos)
            if batch:
                idle_since = time.monotonic()
                done += len(batch)
                yield batch
                if progress is not None:
                    progress(done, total)
            elif todo and time.monotonic() - idle_since > limit:
                raise LogUnavailable(f"no progress reading {topic!r} partitions {sorted(todo)} "
                                     f"for {limit:g} s")

    def records(self, ranges: Ranges, *, progress: Progress | None = None,
                stall_s: float | None = None) -> Iterator[Message]:
        """The messages of :meth:`batches`, one by one."""
        for batch in self.batches(ranges, progress=progress, stall_s=stall_s):
            yield from batch

    def run_events(self, run_id: str, partition: int | None = None, from_offset: int = 0, *,
                   codec: Codec | None = None) -> Iterator[tuple[int, RunEvent]]:
        """One run's decodable events, with their offsets, from ``from_offset`` to the high
        watermark its partition (default: :meth:`partition_of`) had when the read began. Records
        of other runs are skipped undecoded; undecodable ones are the projector's dead letters,
        not the run's story."""
        for offset, ev, _ in self.run_records(run_id, partition, from_offset, codec=codec):
            yield offset, ev

    def run_records(self, run_id: str, partition: int | None = None, from_offset: int = 0, *,
                    codec: Codec | None = None) -> Iterator[tuple[int, RunEvent, str]]:
        """:meth:`run_events` with each event's hash, from its record's bytes as read
        (``runlog.schemas.event_hash(event, body)``): what the fold takes as ``content_hash``."""
        cdc = codec or Codec.from_settings(self.settings)
        p = self.partition_of(run_id) if partition is None else partition
        lo, hi = self.watermarks([p])[p]
        key = run_id.encode("utf-8")
        for m in self.records({p: (max(from_offset, lo), hi)}):
            if m.key() != key:
                continue
            try:
                ev, body = cdc.decode_with_body(m.value(), RunEvent)
            except DecodeError:
                continue
            if ev.run_id == run_id:
                yield m.offset(), ev, event_hash(ev, body)

    def _drop_finished(self, todo: dict[int, int], pos: dict[int, int]) -> None:
        """Partitions whose position passed their end (transaction markers leave offset gaps)."""
        if not todo:
            return
        for tp in self.consumer.position([TopicPartition(self.topic, p) for p in todo]):
            if tp.offset >= 0:
                pos[tp.partition] = max(pos[tp.partition], min(tp.offset, todo[tp.partition]))
                if tp.offset >= todo[tp.partition]:
                    del todo[tp.partition]


# -- one-shot reads (a reader opened and closed around the read) ----------------------------------


def read_range(settings: Settings, ranges: Ranges, *, topic: str | None = None,
               progress: Progress | None = None) -> Iterator[list[Message]]:
    """:meth:`LogReader.batches` of ``ranges`` of ``topic`` (default: the events topic)."""
    with LogReader(settings, topic) as r:
        yield from r.batches(ranges, progress=progress)


def read_run(settings: Settings, run_id: str, partition: int | None = None, from_offset: int = 0, *,
             codec: Codec | None = None) -> Iterator[tuple[int, RunEvent]]:
    """:meth:`LogReader.run_events`: ``(offset, event)`` of one run, in log order."""
    with LogReader(settings) as r:
        yield from r.run_events(run_id, partition, from_offset, codec=codec)


def read_run_records(settings: Settings, run_id: str, partition: int | None = None, from_offset: int = 0, *,
                     codec: Codec | None = None) -> Iterator[tuple[int, RunEvent, str]]:
    """:meth:`LogReader.run_records`: ``(offset, event, hash)`` of one run, in log order."""
    with LogReader(settings) as r:
        yield from r.run_records(run_id, partition, from_offset, codec=codec)


def read_topic(settings: Settings, *, topic: str | None = None, from_offsets: Mapping[int, int] | None = None,
               progress: Progress | None = None,
               ranges_out: dict[int, tuple[int, int]] | None = None) -> Iterator[list[Message]]:
    """Batches of the whole topic (default: the events topic) up to the high watermarks taken when
    the read starts (:meth:`LogReader.topic_ranges`); ``ranges_out`` receives the ranges read
    before the first batch is yielded."""
    with LogReader(settings, topic) as r:
        ranges = r.topic_ranges(from_offsets)
        if ranges_out is not None:
            ranges_out.update(ranges)
        yield from r.batches(ranges, progress=progress)


# -- progress -------------------------------------------------------------------------------------


@contextmanager
def progress_bar(out: TextIO | None, label: str, unit: str = "records") -> Iterator[Progress | None]:
    """A :data:`Progress` drawing a bar on ``out`` (a tqdm bar, closed with a newline when the block
    ends), or None when ``out`` is None. Nothing is written anywhere else."""
    if out is None:
        yield None
        return
    from tqdm import tqdm  # type: ignore[import-untyped]

    bars: list[Any] = []

    def update(done: int, total: int) -> None:
        if not bars:  # drawn from the first call, which knows the total
            bars.append(tqdm(desc=label, total=total, unit=f" {unit}", file=out, mininterval=0.5,
                             dynamic_ncols=True, leave=True))
        bar = bars[0]
        if bar.total != total:
            bar.total = total
        bar.update(done - bar.n)

    try:
        yield update
    finally:
        for bar in bars:
            bar.close()
