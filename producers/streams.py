"""The stream writer: partial model output on the streams topic, keyed by run id, off the run's log.

A model call that streams (a :class:`~runlog.producers.pydantic_ai.RunlogAgent`'s ``run_stream``, ``iter``
with ``node.stream``, an ``event_stream_handler``) is still one recorded call whose result is the
whole response; while it runs, each piece of output is a :class:`~runlog.schemas.StreamRecord` on
``<prefix>runlog.streams``: ``BEGIN``, then ``DELTA`` (text added to a response part) and ``EVENT``
(any other model event, as JSON), then ``FINAL`` (the whole response). A record's address is its
offset in the run's partition: a reader resumes from the offset after the last one it saw
(:mod:`runlog.processors.streams`, ``runlog tail``).

An attempt of a call that the log shows was made before without a result (the process died
mid-stream), or a retry of the call in the same process, starts with a ``SUPERSEDED`` record:
every earlier-``(epoch, attempt)`` record of that ``call_id`` is output of an attempt that did not
finish. A recorded call is never streamed again (its result is read back, as without streaming).

The writer has a producer of its own (``acks=1``, no idempotence, ``linger.ms=2``), so a stream
never waits on or slows the events topic's producer; :meth:`StreamWriter.begin` and the records
after it only enqueue (never block): a full local queue or a failed delivery loses that record,
counted in :attr:`StreamWriter.dropped` / :attr:`StreamWriter.failed` (and in
``runlog_writer_stream_records_total{outcome}`` once :meth:`StreamWriter.count_in` names a registry's
writer metrics) and logged, never the run's result (the recorded call and its ``FINAL`` record hold
the whole response).

With ``RUNLOG_ENCRYPTION`` on, a record's ``text`` and ``data`` are sealed under the run's subject's
data key (``rlenc1:`` + the envelope in base64, :func:`runlog.producers.calls._sealed.seal_text`):
what streams is a prompt's answer too. Readers with the keyring open them
(:class:`runlog.processors.streams.StreamReader`); an erased subject's stream reads nowhere.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError, Message, Producer

from runlog.producers.base._key_source import subject_keys
from runlog.producers.base._keyring import DataKey, SubjectKeys
from runlog.producers.calls._sealed import seal_text
from runlog.schemas import Codec, StreamKind, StreamRecord, now_ms
from runlog.schemas.settings import Settings
from runlog.schemas.topics import Topics

if TYPE_CHECKING:
    from runlog.producers.log._metrics import WriterMetrics

__all__ = ["StreamAttempt", "StreamWriter", "default_stream_writer"]

log = logging.getLogger("runlog.streams")


class StreamWriter:
    """Writes stream records of any run of this process to the streams topic.

    Args:
        producer: a confluent-kafka producer of its own (not the run writer's).
        codec: encodes the records.
        topic: the streams topic (``Topics(prefix).streams``).
    """

    @classmethod
    def from_settings(cls, settings: Settings) -> StreamWriter:
        """A writer with its own producer: ``acks=1``, not idempotent, ``linger.ms=2``."""
        conf = settings.producer_config(**{"enable.idempotence": False, "acks": 1, "linger.ms": 2,
                                           "message.timeout.ms": 30_000})
        keys = subject_keys(settings) if settings.encryption else None
        return cls(Producer(conf), Codec.from_settings(settings), Topics.of(settings).streams, keys=keys,
                   default_subject=settings.default_subject)

    def __init__(self, producer: Producer, codec: Codec, topic: str, *, keys: SubjectKeys | None = None,
                 default_subject: str = "default") -> None:
        self.keys = keys
        """Seals each record's text and data when set (``RUNLOG_ENCRYPTION``)."""
        self.default_subject = default_subject
        self._producer = producer
        self._codec = codec
        self.topic = topic
        self.produced = 0
        """Records handed to the producer."""
        self.dropped = 0
        """Records not produced: the producer's local queue was full (never waited for)."""
        self.failed = 0
        """Records the broker did not acknowledge."""
        self._lock = threading.Lock()
        self._metrics: WriterMetrics | None = None

    def count_in(self, metrics: WriterMetrics | None) -> None:
        """Count this writer's records in ``metrics``' ``runlog_writer_stream_records_total`` too (a
        run writer's metrics: the registry its application exposes); the first one given is kept."""
        if metrics is not None and self._metrics is None:
            self._metrics = metrics

    def _count(self, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.stream.labels(outcome).inc()

    def begin(self, *, run_id: str, stage: str, call_id: str, epoch: int, attempt: int,
              supersedes: bool, subject: str | None = None) -> StreamAttempt:
        """Start an attempt of a streaming call: ``SUPERSEDED`` first when ``supersedes`` (an
        earlier attempt of ``call_id`` may have streamed), then ``BEGIN``. ``subject``: the run's
        (its records are sealed under that subject's key when encryption is on)."""
        key = self.keys.for_subject(subject or self.default_subject) if self.keys is not None else None
        a = StreamAttempt(self, run_id, stage, call_id, epoch, attempt, key)
        if supersedes:
            a.write(StreamKind.SUPERSEDED)
        a.write(StreamKind.BEGIN)
        return a

    def write(self, record: StreamRecord) -> None:
        """Enqueue one record (never blocks: a full queue drops it, counted and logged)."""
        value = self._codec.encode(record)
        try:
            self._producer.produce(self.topic, key=record.run_id.encode("utf-8"), value=value,
                                   on_delivery=self._delivered)
        except BufferError:
            with self._lock:
                self.dropped += 1
            self._count("dropped")
            log.warning("stream record of run %s call %s dropped: the producer's queue is full",
                        record.run_id, record.call_id)
        else:
            with self._lock:
                self.produced += 1
            self._count("produced")
        self._producer.poll(0)

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            with self._lock:
                self.failed += 1
            self._count("failed")
            log.warning("stream record not delivered to %s: %s", self.topic, err)

    def flush(self, timeout: float = 10.0) -> int:
        """Wait up to ``timeout`` seconds for every enqueued record; returns how many are left."""
        left: int = self._producer.flush(timeout)
        return left


class StreamAttempt:
    """One attempt of one streaming call: its records, numbered from 0 (``index``)."""

    def __init__(self, writer: StreamWriter, run_id: str, stage: str, call_id: str, epoch: int,
                 attempt: int, data_key: DataKey | None = None) -> None:
        self._writer = writer
        self._key = (run_id, stage, call_id, epoch, attempt)
        self._index = 0
        self._data_key = data_key

    def write(self, kind: StreamKind, *, part: int | None = None, text: str | None = None,
              data: str | None = None) -> None:
        run_id, stage, call_id, epoch, attempt = self._key
        if self._data_key is not None:  # sealed: the stream is the answer, in pieces
            text = None if text is None else seal_text(self._data_key, text)
            data = None if data is None else seal_text(self._data_key, data)
        self._writer.write(StreamRecord(run_id, stage, call_id, epoch, now_ms(), kind, attempt=attempt,
                                        index=self._index, part=part, text=text, data=data,
                                        produced_ns=time.time_ns()))
        self._index += 1

    def delta(self, part: int, text: str) -> None:
        self.write(StreamKind.DELTA, part=part, text=text)

    def event(self, data: str) -> None:
        self.write(StreamKind.EVENT, data=data)

    def final(self, data: str) -> None:
        self.write(StreamKind.FINAL, data=data)


_defaults: dict[tuple[str, str], StreamWriter] = {}
_default_lock = threading.Lock()


def default_stream_writer(settings: Settings | None = None) -> StreamWriter:
    """The process's stream writer for the cluster and topic prefix of ``settings`` (default
    ``Settings.from_env()``): made on first use, flushed at exit."""
    settings = settings or Settings.from_env()
    key = (settings.kafka_bootstrap_servers, settings.topic_prefix)
    with _default_lock:
        writer = _defaults.get(key)
        if writer is None:
            writer = _defaults[key] = StreamWriter.from_settings(settings)
            atexit.register(writer.flush, 5.0)
        return writer
