"""Shared helpers of the producer integration tests: read a run's events with a plain consumer."""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, TopicPartition

from schemas import Codec, RunEvent, Settings, Topics


@dataclass(frozen=True)
class Read:
    event: RunEvent
    partition: int
    offset: int
    key: bytes


def read_events(settings: Settings, *, timeout: float = 30.0) -> list[Read]:
    """Every record of the events topic up to its current high watermarks, decoded with the schemas only."""
    topic = Topics.of(settings).events
    conf = settings.consumer_config(f"t-read-{uuid.uuid4().hex[:8]}")
    consumer = Consumer(conf)
    codec = Codec()
    try:
        md = consumer.list_topics(topic, timeout=10)
        parts = sorted(md.topics[topic].partitions)
        ends: dict[int, int] = {}
        for p in parts:
            lo, hi = watermarks(consumer, topic, p)
            if hi > lo:
                ends[p] = hi
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        out: list[Read] = []
        pos: dict[int, int] = defaultdict(int)
        deadline = time.monotonic() + timeout
        while any(pos[p] < hi for p, hi in ends.items()):
            assert time.monotonic() < deadline, f"read only {dict(pos)} of {ends}"
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            pos[msg.partition()] = msg.offset() + 1
            out.append(Read(codec.decode(msg.value(), RunEvent), msg.partition(), msg.offset(), msg.key()))
        return out
    finally:
        consumer.close()


def watermarks(consumer: Consumer, topic: str, partition: int, attempts: int = 20) -> tuple[int, int]:
    """Low and high watermark, retrying while a new topic's partition leader is elected."""
    for i in range(attempts):
        try:
            lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            return int(lo), int(hi)
        except KafkaException:
            if i == attempts - 1:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


def events_of(reads: list[Read], run_id: str) -> list[Read]:
    """A run's records in log order (partition, offset)."""
    mine = [r for r in reads if r.event.run_id == run_id]
    return sorted(mine, key=lambda r: (r.partition, r.offset))
