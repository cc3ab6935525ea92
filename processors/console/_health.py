"""The console's health page: the lag of the projector group(s) on the events topic and of every
resumer group on the resume topic (committed offsets against high watermarks, asked of the admin
API: no group is joined or committed), the dead-letter topic's count and newest records (read
with an assigned, never-committing reader), and the projection's marker and rebuild lock (Redis,
only read)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from processors.dlq import H_DETAIL, H_OFFSET, H_PARTITION, H_REASON, H_TOPIC, parse_headers
from projections import RedisStore
from schemas import RunlogError, Settings, Topics

__all__ = ["DeadLetterView", "GroupLag", "Health", "read_health"]

@dataclass(frozen=True)
class GroupLag:
    """A consumer group on one topic: its members and how far it is behind the high watermarks."""

    group: str
    role: str
    topic: str
    state: str
    members: int
    lag: int
    """Records between the group's committed offsets and the high watermarks (partitions it
    never committed count from their low watermark)."""
    uncommitted: int
    """Partitions with records the group never committed an offset for."""
    error: str = ""


@dataclass(frozen=True)
class DeadLetterView:
    partition: int
    offset: int
    timestamp_ms: int
    reason: str
    detail: str
    origin: str


@dataclass
class Health:
    """The projector's and the resumers' health as Kafka and Redis show it."""

    groups: list[GroupLag] = field(default_factory=list)
    dead_letters: int = 0
    latest_dead_letters: list[DeadLetterView] = field(default_factory=list)
    marker: str = ""
    """The projection namespace: ``ready``, ``rebuilding`` or ``missing``."""
    rebuild_locked: bool = False
    counts: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    read_at: int = 0


def _watermarks(admin: Any, topic: str, timeout: float) -> dict[int, tuple[int, int]]:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    md = admin.list_topics(topic, timeout=timeout).topics.get(topic)
    if md is None or md.error is not None:
        raise RunlogError(f"topic {topic!r} not found")
    parts = sorted(md.partitions)
    lows = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.earliest() for p in parts},
                              request_timeout=timeout)
    highs = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.latest() for p in parts},
                               request_timeout=timeout)
    lo = {tp.partition: int(f.result().offset) for tp, f in lows.items()}
    hi = {tp.partition: int(f.result().offset) for tp, f in highs.items()}
    return {p: (lo[p], hi[p]) for p in parts}


def _group_lag(admin: Any, group: str, role: str, topic: str, marks: Mapping[int, tuple[int, int]],
               timeout: float) -> GroupLag | None:
    """The group's lag on ``topic``; None when it has neither offsets nor members there."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    desc = admin.describe_consumer_groups([group], request_timeout=timeout)[group].result()
    members = [m for m in desc.members
               if any(tp.topic == topic for tp in (m.assignment.topic_partitions if m.assignment else []))]
    got = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)],
                                            request_timeout=timeout)[group].result()
    committed = {tp.partition: int(tp.offset) for tp in got.topic_partitions
                 if tp.topic == topic and tp.offset >= 0}
    if not committed and not members:
        return None
    lag = uncommitted = 0
    for p, (lo, hi) in marks.items():
        if p in committed:
            lag += max(0, hi - max(committed[p], lo))
        elif hi > lo:
            lag += hi - lo
            uncommitted += 1
    state = getattr(desc.state, "name", str(desc.state))
    return GroupLag(group, role, topic, state, len(members), lag, uncommitted)


def _latest_dead_letters(settings: Settings, topic: str, marks: Mapping[int, tuple[int, int]], n: int,
                         timeout: float) -> list[DeadLetterView]:
    """The newest ``n`` dead letters of every partition, newest first (read with an assigned,
    never-committing consumer; no record for ``timeout`` seconds raises :class:`RunlogError`)."""
    from projections.log_reader import LogReader

    todo = {p: (max(lo, hi - n), hi) for p, (lo, hi) in marks.items() if hi > lo}
    if not todo:
        return []
    out: list[DeadLetterView] = []
    with LogReader(settings, topic, name="runlog-console", poll_timeout=0.5) as r:
        for m in r.records(todo, stall_s=timeout):
            h = parse_headers(m.headers())
            origin = f"{h.get(H_TOPIC, '?')}[{h.get(H_PARTITION, '?')}]@{h.get(H_OFFSET, '?')}"
            out.append(DeadLetterView(m.partition(), m.offset(), m.timestamp()[1], h.get(H_REASON, "?"),
                                      h.get(H_DETAIL, ""), origin))
    out.sort(key=lambda d: (d.timestamp_ms, d.offset), reverse=True)
    return out[:n]


def read_health(settings: Settings, store: RedisStore, admin: Any, *, projector_groups: Iterable[str],
                timeout: float = 5.0, dead_letters_shown: int = 10) -> Health:
    """Lag of the projector group(s) on the events topic and of every resumer group
    (``<RUNLOG_RESUMER_GROUP>.*``) on the resume topic, dead letters, the projection marker.

    A part that cannot be read is reported in :attr:`Health.errors`; the others are still read.
    """
    from confluent_kafka import KafkaException

    names = Topics.of(settings)
    h = Health(read_at=int(time.time() * 1000))
    try:
        marker = store.marker()
        h.marker = "missing" if marker is None else marker.state
        h.rebuild_locked = store.rebuild_locked()
        h.counts = {s.value: n for s, n in store.counts().items()}
    except (RunlogError, redis.RedisError) as err:
        h.errors.append(f"redis: {err}")
    try:
        events = _watermarks(admin, names.events, timeout)
        for g in (settings.group_id(g) for g in projector_groups):  # the ids under the topic prefix
            lag = _group_lag(admin, g, "projector", names.events, events, timeout)
            h.groups.append(lag or GroupLag(g, "projector", names.events, "absent", 0,
                                            sum(hi - lo for lo, hi in events.values()),
                                            sum(hi > lo for lo, hi in events.values()),
                                            "no offsets and no members on this topic"))
        resume = _watermarks(admin, names.resume, timeout)
        listed = admin.list_consumer_groups(request_timeout=timeout).result()
        prefix = settings.group_id(settings.resumer_group + ".")
        for gid in sorted(g.group_id for g in listed.valid if g.group_id.startswith(prefix)):
            lag = _group_lag(admin, gid, "resumer", names.resume, resume, timeout)
            if lag is not None:
                h.groups.append(lag)
        dlq = _watermarks(admin, names.dlq, timeout)
        h.dead_letters = sum(hi - lo for lo, hi in dlq.values())
        h.latest_dead_letters = _latest_dead_letters(settings, names.dlq, dlq, dead_letters_shown, timeout)
    except (KafkaException, RunlogError) as err:
        h.errors.append(f"kafka: {err}")
    return h
