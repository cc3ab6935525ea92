"""Streamed model output with encryption on: the records' text and data are sealed under the run's
subject's key on the topic, a reader with the keyring reads them back, one without it reads only
sealed text, and once the subject is erased the stream reads as erased everywhere."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from runlog.processors.streams import ERASED, StreamReader
from runlog.producers.internal import SubjectKeys
from runlog.producers.streams import StreamWriter
from runlog.schemas import Settings, StreamKind, Topics, partition_for

pytestmark = pytest.mark.integration


def _raw_values(settings: Settings, run_id: str) -> list[bytes]:
    topic = Topics.of(settings).streams
    c = Consumer(settings.consumer_config(f"t-raw-{uuid.uuid4().hex[:6]}", **{"enable.auto.commit": False}))
    try:
        p = partition_for(run_id, settings.partitions)
        lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
        c.assign([TopicPartition(topic, p, lo)])
        out: list[bytes] = []
        while len(out) < hi - lo:
            m = c.poll(10)
            assert m is not None and m.error() is None
            out.append(m.value())
        return out
    finally:
        c.close()


def _read(settings: Settings, run_id: str) -> list[tuple[StreamKind, str | None, str | None]]:
    with StreamReader(settings, run_id) as r:
        return [(e.record.kind, e.record.text, e.record.data) for e in r.read_to_end() if e.record]


def test_a_stream_is_sealed_on_the_topic_and_read_back_with_the_keyring(topics: Settings,
                                                                         tmp_path: Path) -> None:
    sealed = topics.with_(encryption=True, keyring=str(tmp_path / "keyring"))
    planted = f"secret-{uuid.uuid4().hex}"
    writer = StreamWriter.from_settings(sealed)
    a = writer.begin(run_id="run-s", stage="s", call_id="s/model/0", epoch=1, attempt=1, supersedes=False,
                     subject="customer-1")
    a.delta(0, f"the answer is {planted}")
    a.final(f'{{"answer": "{planted}"}}')
    assert writer.flush(30) == 0 and writer.failed == 0
    raw = _raw_values(sealed, "run-s")
    assert len(raw) == 3 and not any(planted.encode() in v for v in raw)
    assert _read(sealed, "run-s")[1:] == [(StreamKind.DELTA, f"the answer is {planted}", None),
                                          (StreamKind.FINAL, None, f'{{"answer": "{planted}"}}')]
    unkeyed = _read(topics, "run-s")  # a reader without the keyring: the envelope, not the text
    assert all(planted not in (t or "") + (d or "") for _, t, d in unkeyed)
    assert unkeyed[1][1] is not None and unkeyed[1][1].startswith("rlenc1:")
    SubjectKeys(sealed.keyring).erase("customer-1", by="test", reason="a deletion request")
    assert _read(sealed, "run-s")[1:] == [(StreamKind.DELTA, ERASED, None), (StreamKind.FINAL, None, ERASED)]
