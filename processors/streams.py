"""Reading a run's streamed model output from an offset (the client behind ``runlog tail``).

The streams topic (:mod:`runlog.producers.streams`) keeps a run's records in one partition, in the order
they were written; a record's address is its offset there. :class:`StreamReader` reads the run's
partition from an offset (no consumer group: the reader keeps its own place), hands back the run's
records with their offsets and :attr:`StreamReader.next_offset`, the offset to resume from after a
disconnect (``StreamReader(settings, run_id, from_offset=reader.next_offset)``): nothing is missed
and nothing is read twice. Records of other runs sharing the partition are skipped.

A record that does not decode is handed back as an entry with its :class:`~runlog.schemas.errors.DecodeError`
(``entry.error``, its ``reason``), and, with ``dead_letters`` given, produced to the dead-letter
topic with the headers every dead letter carries (:func:`runlog.processors.dlq.headers`, the original
topic, partition and offset: produced at least once, readers deduplicate by them).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from runlog.processors.dlq import headers
from runlog.producers.internal import open_text, subject_keys
from runlog.schemas import Codec, StreamKind, StreamRecord
from runlog.schemas.errors import ConfigError, DecodeError, LogUnavailable, SubjectErased
from runlog.schemas.internal import served
from runlog.schemas.settings import Settings
from runlog.schemas.topics import Topics, partition_for

__all__ = ["ERASED", "StreamEntry", "StreamReader", "superseded"]

ERASED = "[erased]"
"""What a sealed text or data of an erased subject reads as."""


@dataclass(frozen=True, slots=True)
class StreamEntry:
    """One record of a run's partition: its offset and the record, or why it does not decode."""

    offset: int
    record: StreamRecord | None
    error: DecodeError | None = None
    run_id: str = ""


def superseded(records: list[StreamRecord]) -> set[int]:
    """Positions in ``records`` (a run's records in log order) that a later ``SUPERSEDED`` record of
    their call marks as output of an attempt that did not finish."""
    out: set[int] = set()
    for i, r in enumerate(records):
        if r.kind is StreamKind.SUPERSEDED:
            out.update(j for j, old in enumerate(records[:i]) if old.call_id == r.call_id
                       and (old.epoch, old.attempt) < (r.epoch, r.attempt))
    return out


class StreamReader:
    """Reads one run's stream records from ``from_offset`` (0: the oldest kept); or, with
    ``runs`` (run id -> first offset) instead, several runs' with one consumer, as a server
    relaying many runs' streams does (:meth:`next_offset_of` each run's place).

    Args:
        settings: the cluster and topic prefix.
        run_id: the run.
        from_offset: the first offset to read (a previous reader's :attr:`next_offset`).
        dead_letters: a producer to dead-letter undecodable records with (None: only reported).
        codec: the codec to decode with (None: the settings' own).
        opened: open sealed text and data with the keyring (False: they stay sealed).
    """

    def __init__(self, settings: Settings, run_id: str = "", *, from_offset: int = 0,
                 runs: Mapping[str, int] | None = None, dead_letters: Producer | None = None,
                 codec: Codec | None = None, opened: bool = True) -> None:
        wanted = dict(runs) if runs is not None else {run_id: from_offset}
        if not wanted or any(not r for r in wanted):
            raise ConfigError("a stream reader needs a run id")
        bad = {r: o for r, o in wanted.items() if o < 0}
        if bad:
            raise ConfigError(f"stream offsets must be 0 or more, got {bad}")
        topics = Topics.of(settings)
        self.topic = topics.streams
        self.dlq_topic = topics.dlq
        self.run_id = next(iter(wanted))
        self._from = {r.encode("utf-8"): o for r, o in wanted.items()}
        self._codec = codec or Codec.from_settings(settings)
        self._keys = subject_keys(settings) if settings.encryption and opened else None
        """Opens sealed text and data (``RUNLOG_ENCRYPTION``, unless ``opened`` is False: the console
        for a reader who has not signed in); without it they read as sealed."""
        self._dead_letters = dead_letters
        self._consumer = Consumer(settings.consumer_config(
            f"runlog-tail-{uuid.uuid4().hex[:12]}", **{"enable.auto.commit": False,
                                                         "enable.partition.eof": False}))
        n = self._partitions()
        self._partition_of = {r: partition_for(r, n) for r in wanted}
        self.partition = self._partition_of[self.run_id]
        self._next: dict[int, int] = {}
        for r, o in wanted.items():
            p = self._partition_of[r]
            self._next[p] = min(o, self._next.get(p, o))
        self.trimmed: dict[int, int] = {}
        """Partition -> the oldest offset kept, where an asked offset was older (deleted by the
        topic's retention): reading starts there, and the gap is named here."""
        for p, o in list(self._next.items()):
            low, high = self._watermarks(p)
            if o > high:
                self._consumer.close()
                raise ConfigError(f"stream offset {o} is past the end ({high}) of partition {p} of "
                                  f"{self.topic}")
            if o < low:
                self.trimmed[p] = self._next[p] = low
                for r in [r for r, q in self._partition_of.items() if q == p]:
                    self._from[r.encode("utf-8")] = max(self._from[r.encode("utf-8")], low)
        self._consumer.assign([TopicPartition(self.topic, p, o) for p, o in self._next.items()])

    @property
    def next_offset(self) -> int:
        """The offset to resume the (first) run from: one past the last record read of its partition."""
        return self.next_offset_of(self.run_id)

    def next_offset_of(self, run_id: str) -> int:
        """The offset to resume ``run_id`` from."""
        return max(self._next[self._partition_of[run_id]], self._from[run_id.encode("utf-8")])

    def _watermarks(self, partition: int) -> tuple[int, int]:
        tp = TopicPartition(self.topic, partition)
        low, high = served(self._consumer, lambda t: self._consumer.get_watermark_offsets(tp, timeout=t), 10)
        return int(low), int(high)

    def _partitions(self) -> int:
        md = served(self._consumer, lambda t: self._consumer.list_topics(self.topic, timeout=t), 10)
        t = md.topics.get(self.topic)
        if t is None or t.error is not None or not t.partitions:
            raise ConfigError(f"the streams topic {self.topic} does not exist (create it with `runlog init`)")
        return len(t.partitions)

    def poll(self, timeout: float = 1.0, max_records: int = 500) -> list[StreamEntry]:
        """The runs' entries that arrive within ``timeout`` seconds (possibly none)."""
        out: list[StreamEntry] = []
        first = self._consumer.poll(timeout)  # returns as soon as one record is there (consume waits
        if first is None:                     # for max_records or the whole timeout)
            return out
        for msg in [first, *self._consumer.consume(max_records - 1, 0)]:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                raise LogUnavailable(f"reading {self.topic}: {err}")
            offset = msg.offset()
            self._next[msg.partition()] = offset + 1
            key = msg.key()
            start = self._from.get(key) if key is not None else None
            if start is None or offset < start:
                continue
            run = key.decode("utf-8") if key is not None else ""
            try:
                record = self._opened(self._codec.decode(msg.value() or b"", StreamRecord))
                out.append(StreamEntry(offset, record, None, run))
            except DecodeError as bad:
                self._dead_letter(msg, bad)
                out.append(StreamEntry(offset, None, bad, run))
        return out

    def _opened(self, record: StreamRecord) -> StreamRecord:
        """``record`` with its sealed text and data opened (an erased subject's read as
        ``[erased]``: the stream is gone with the key)."""
        if self._keys is None:
            return record
        try:
            return dataclasses.replace(
                record, text=None if record.text is None else open_text(self._keys, record.text),
                data=None if record.data is None else open_text(self._keys, record.data))
        except SubjectErased:
            return dataclasses.replace(record, text=None if record.text is None else ERASED,
                                       data=None if record.data is None else ERASED)

    def _dead_letter(self, msg: Any, err: DecodeError) -> None:
        if self._dead_letters is None:
            return
        self._dead_letters.produce(self.dlq_topic, key=msg.key(), value=msg.value() or b"",
                                   headers=list(headers(err.reason, err.detail, self.topic, msg.partition(),
                                                        msg.offset())))
        self._dead_letters.flush(10)

    def follow(self, *, idle_timeout: float | None = None, until_final: bool = False,
               ended: Callable[[], bool] | None = None, check_every: float = 1.0) -> Iterator[StreamEntry]:
        """The run's entries as they arrive; stops after ``idle_timeout`` seconds without one (None:
        never) or, with ``until_final``, after the run's final answer.

        A ``FINAL`` record ends one model call, and an agent that calls tools makes several: the
        run's answer is its last one. So with ``ended`` (whether the run has ended: completed,
        failed, blocked or cancelled), asked after each ``FINAL`` record and every ``check_every``
        seconds, following stops once the run has ended and everything written before is read.
        Without ``ended``, it stops after the first ``FINAL`` record."""
        last = checked = time.monotonic()
        while True:
            got = self.poll(0.2)
            final = False
            for entry in got:
                yield entry
                if until_final and entry.record is not None and entry.record.kind is StreamKind.FINAL:
                    if ended is None:
                        return
                    final = True
            now = time.monotonic()
            if until_final and ended is not None and (final or now - checked >= check_every):
                checked = now
                if ended():
                    yield from self.read_to_end()  # what was written before the run ended
                    return
            if got:
                last = now
            elif idle_timeout is not None and now - last >= idle_timeout:
                return

    def end_offset(self) -> int:
        """The (first) run's partition's end (high watermark) now: reading up to it reads everything
        written so far."""
        return self._watermarks(self.partition)[1]

    def read_to_end(self) -> Iterator[StreamEntry]:
        """The run's entries written so far (up to :meth:`end_offset` when called)."""
        end = self.end_offset()
        while self.next_offset < end:
            yield from self.poll(0.5)

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> StreamReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
