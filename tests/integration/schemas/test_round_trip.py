"""Avro RunEvents through the real broker: keyed by run id, one partition per run, in order."""

from __future__ import annotations

from collections import defaultdict

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from runlog.schemas import Codec, EventType, RunEvent, Settings, Topics, partition_for

pytestmark = pytest.mark.integration


def test_fifty_runs_keep_order_on_one_partition_each(topics: Settings) -> None:
    s = topics
    topic = Topics.of(s).events
    codec = Codec()
    producer = Producer(s.producer_config())
    sent: dict[str, list[RunEvent]] = defaultdict(list)
    acked: list[str] = []

    def on_delivery(err: object, msg: object) -> None:
        assert err is None, err
        acked.append("x")

    types = [EventType.RUN_STARTED, EventType.STAGE_STARTED, EventType.TOOL_CALLED,
             EventType.TOOL_RESULT, EventType.VERIFIED, EventType.RUN_COMPLETED]
    for seq, et in enumerate(types, start=1):  # interleave runs, as concurrent agents do
        for i in range(50):
            run_id = f"run-{i:03d}"
            ev = RunEvent(run_id, seq, 1, et, 1_764_000_000_000 + seq, stage=f"s{seq}",
                          attributes={"i": str(i)})
            sent[run_id].append(ev)
            producer.produce(topic, key=run_id.encode(), value=codec.encode(ev),
                             on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(30) == 0
    assert len(acked) == 300

    consumer = Consumer(s.consumer_config(f"{s.topic_prefix}rt"))
    md = consumer.list_topics(topic, timeout=10)
    assert len(md.topics[topic].partitions) == 12
    consumer.assign([TopicPartition(topic, p, 0) for p in range(12)])
    got: dict[str, list[RunEvent]] = defaultdict(list)
    partitions: dict[str, set[int]] = defaultdict(set)
    n = 0
    while n < 300:
        msg = consumer.poll(10)
        assert msg is not None, f"only {n} of 300 events came back"
        assert msg.error() is None, msg.error()
        ev = codec.decode(msg.value(), RunEvent)
        assert msg.key().decode() == ev.run_id
        got[ev.run_id].append(ev)
        partitions[ev.run_id].add(msg.partition())
        assert msg.partition() == partition_for(ev.run_id, 12)  # resume computes it the same way
        n += 1
    consumer.close()
    assert got == sent
    assert all(len(p) == 1 for p in partitions.values())
    assert len({p for ps in partitions.values() for p in ps}) > 1  # runs spread over partitions
