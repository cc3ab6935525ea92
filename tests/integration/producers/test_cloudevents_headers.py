"""Every record the writer produces carries the CloudEvents Kafka binding's binary-mode headers, read back
with a plain confluent-kafka consumer: for a real run, for duplicates of an event, for resume requests."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from confluent_kafka import Consumer, Message, TopicPartition

from runlog.producers import Runner
from runlog.producers.log._writer import RunWriter
from runlog.schemas import Codec, EventType, ResumeRequest, RunEvent, Settings, Topics, now_ms
from runlog.schemas.errors import DeliveryError
from tests.integration.producers.helpers import watermarks
from tests.integration.producers.test_write_path import EXPECTED, content_workflow

pytestmark = pytest.mark.integration

NAMES = ["ce_specversion", "ce_id", "ce_source", "ce_type", "ce_time", "ce_subject", "content-type"]


def records(settings: Settings, topic: str) -> list[Message]:
    """Every record of ``topic`` up to its current high watermarks, as the client gives them."""
    consumer = Consumer(settings.consumer_config(f"t-ce-{uuid.uuid4().hex[:8]}"))
    try:
        parts = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        ends = {p: hi for p in parts if (hi := watermarks(consumer, topic, p)[1]) > 0}
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        out: list[Message] = []
        pos = dict.fromkeys(ends, 0)
        while any(pos[p] < hi for p, hi in ends.items()):
            m = consumer.poll(10)
            assert m is not None, f"read only {pos} of {ends}"
            assert m.error() is None, m.error()
            pos[m.partition()] = m.offset() + 1
            out.append(m)
        return out
    finally:
        consumer.close()


def headers_of(m: Message) -> dict[str, str]:
    raw = m.headers() or []
    assert [k for k, _ in raw] == NAMES, raw  # each once, nothing else
    return {k: (v or b"").decode("utf-8") for k, v in raw}


def time_of(text: str) -> int:
    assert text.endswith("Z") and len(text) == len("2026-01-02T03:04:05.678Z"), text
    return round(datetime.fromisoformat(text).astimezone(UTC).timestamp() * 1000)


def test_every_record_of_a_run_carries_the_cloudevents_headers(runner: Runner, topics: Settings) -> None:
    result = runner.run(content_workflow(), {"topic": "kafka"}, inputs={"facts": "v1"})
    events_topic = Topics.of(topics).events
    codec = Codec()
    seen: list[tuple[RunEvent, dict[str, str]]] = []
    for m in records(topics, events_topic):
        value = m.value()
        assert value is not None
        event = codec.decode(value, RunEvent)
        if event.run_id == result.run_id:
            seen.append((event, headers_of(m)))
    assert [(e.type, e.stage, e.call_id) for e, _ in seen] == EXPECTED
    for event, h in seen:
        assert h["ce_specversion"] == "1.0"
        assert h["ce_id"] == f"{event.run_id}:{event.seq}:{event.epoch}"
        assert h["ce_source"] == f"runlog://{events_topic}/{runner.writer.writer_id}"
        assert h["ce_type"] == f"dev.runlog.run.{event.type.value}"
        assert time_of(h["ce_time"]) == event.occurred_at
        assert h["ce_subject"] == result.run_id
        assert h["content-type"] == "application/avro; framing=single-object"
    assert len({h["ce_id"] for _, h in seen}) == len(seen)
    assert {h["ce_type"] for _, h in seen} >= {"dev.runlog.run.RUN_STARTED", "dev.runlog.run.EFFECT_INTENT",
                                               "dev.runlog.run.VERIFIED", "dev.runlog.run.RUN_COMPLETED"}


def test_copies_of_an_event_share_the_id_and_other_events_do_not(topics: Settings) -> None:
    writer = RunWriter(topics, writer_id="writer-ce-test")
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    event = RunEvent(run_id=run_id, seq=1, epoch=1, type=EventType.RUN_STARTED, occurred_at=now_ms())
    fenced = replace(event, epoch=2)  # another writer's seq 1: another event
    errors: list[DeliveryError] = []
    try:
        for e in (event, event, fenced, event):  # the same event three times (duplicates), another once
            writer.produce(e, lambda err, p, o: errors.append(err) if err else None)
    finally:
        writer.close()
    assert errors == []
    got = [headers_of(m) for m in records(topics, Topics.of(topics).events) if m.key() == run_id.encode()]
    assert [h["ce_id"] for h in got] == [f"{run_id}:1:1", f"{run_id}:1:1", f"{run_id}:1:2", f"{run_id}:1:1"]
    assert got[0] == got[1] == got[3]  # every header of every copy
    assert got[2]["ce_source"] == got[0]["ce_source"] == f"runlog://{Topics.of(topics).events}/writer-ce-test"


def test_resume_requests_carry_their_own_type(topics: Settings) -> None:
    writer = RunWriter(topics, writer_id="writer ce/1")
    try:
        writer.request_resume("run-r", "lease expired")
        writer.request_resume("run-r", "again")
    finally:
        writer.close()
    resume_topic = Topics.of(topics).resume
    msgs = [m for m in records(topics, resume_topic) if m.key() == b"run-r"]
    assert len(msgs) == 2
    ids = set()
    codec = Codec()
    for m in msgs:
        h = headers_of(m)
        value = m.value()
        assert value is not None
        req = codec.decode(value, ResumeRequest)
        assert h["ce_specversion"] == "1.0"
        assert str(uuid.UUID(h["ce_id"])) == h["ce_id"]
        ids.add(h["ce_id"])
        assert h["ce_source"] == f"runlog://{resume_topic}/writer%20ce%2F1"
        assert h["ce_type"] == "dev.runlog.resume.requested"
        assert time_of(h["ce_time"]) == req.requested_at
        assert h["ce_subject"] == "run-r" == req.run_id
        assert h["content-type"] == "application/avro; framing=single-object"
    assert len(ids) == 2



def test_resume_requests_from_the_cli_path_carry_them_too(topics: Settings) -> None:
    from runlog.processors.resume import request_resume

    request_resume(topics, "run-cli", "operator asked", requested_by="cli")
    resume_topic = Topics.of(topics).resume
    msgs = [m for m in records(topics, resume_topic) if m.key() == b"run-cli"]
    assert len(msgs) == 1
    h = headers_of(msgs[0])
    assert h["ce_type"] == "dev.runlog.resume.requested" and h["ce_subject"] == "run-cli"
    assert h["ce_source"] == f"runlog://{resume_topic}/cli"
