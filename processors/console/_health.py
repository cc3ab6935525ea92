"""The console's health page: the lag of the projector group(s) on the events topic and of every
resumer group on the resume topic (committed offsets, asked of the admin API, against the
watermarks of :func:`runlog.schemas._kafka.watermarks`: no group is joined or committed), the dead-letter
topic's count and newest records (read with an assigned, never-committing reader), and the
projection's marker and rebuild lock (Redis, only read)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis

from runlog.processors.dlq import H_DETAIL, H_OFFSET, H_PARTITION, H_REASON, H_TOPIC, parse_headers
from runlog.projections import RedisStore
from runlog.schemas import RunlogError, Settings, Topics

if TYPE_CHECKING:
    from runlog.projections.log_reader import LogReader

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


def _latest_dead_letters(reader: LogReader, marks: Mapping[int, tuple[int, int]], n: int,
                         timeout: float) -> list[DeadLetterView]:
    """The newest ``n`` dead letters of every partition, newest first (read with ``reader``, on the
    dead-letter topic; no record for ``timeout`` seconds raises :class:`RunlogError`)."""
    todo = {p: (max(lo, hi - n), hi) for p, (lo, hi) in marks.items() if hi > lo}
    if not todo:
        return []
    out: list[DeadLetterView] = []
    for m in reader.records(todo, stall_s=timeout):
        h = parse_headers(m.headers())
        origin = f"{h.get(H_TOPIC, '?')}[{h.get(H_PARTITION, '?')}]@{h.get(H_OFFSET, '?')}"
        out.append(DeadLetterView(m.partition(), m.offset(), m.timestamp()[1], h.get(H_REASON, "?"),
                                  h.get(H_DETAIL, ""), origin))
    out.sort(key=lambda d: (d.timestamp_ms, d.offset), reverse=True)
    return out[:n]


def _kafka_health(h: Health, settings: Settings, admin: Any, reader: LogReader,
                  projector_groups: Iterable[str], timeout: float, dead_letters_shown: int) -> None:
    """The groups' lag and the dead letters into ``h``; ``reader`` reads the dead-letter topic, and its
    consumer every watermark (a leader election is waited out, :func:`runlog.schemas._kafka.watermarks`)."""
    from runlog.schemas.internal import watermarks

    names = Topics.of(settings)
    events = watermarks(reader.consumer, names.events, timeout=timeout)
    for g in (settings.group_id(g) for g in projector_groups):  # the ids under the topic prefix
        lag = _group_lag(admin, g, "projector", names.events, events, timeout)
        h.groups.append(lag or GroupLag(g, "projector", names.events, "absent", 0,
                                        sum(hi - lo for lo, hi in events.values()),
                                        sum(hi > lo for lo, hi in events.values()),
                                        "no offsets and no members on this topic"))
    resume = watermarks(reader.consumer, names.resume, timeout=timeout)
    listed = admin.list_consumer_groups(request_timeout=timeout).result()
    prefix = settings.group_id(settings.resumer_group + ".")
    for gid in sorted(g.group_id for g in listed.valid if g.group_id.startswith(prefix)):
        lag = _group_lag(admin, gid, "resumer", names.resume, resume, timeout)
        if lag is not None:
            h.groups.append(lag)
    dlq = reader.watermarks()
    h.dead_letters = sum(hi - lo for lo, hi in dlq.values())
    h.latest_dead_letters = _latest_dead_letters(reader, dlq, dead_letters_shown, timeout)


def read_health(settings: Settings, store: RedisStore, admin: Any, *, projector_groups: Iterable[str],
                timeout: float = 5.0, dead_letters_shown: int = 10) -> Health:
    """Lag of the projector group(s) on the events topic and of every resumer group
    (``<RUNLOG_RESUMER_GROUP>.*``) on the resume topic, dead letters, the projection marker.

    A part that cannot be read is reported in :attr:`Health.errors`; the others are still read.
    """
    from confluent_kafka import KafkaException

    from runlog.projections.log_reader import LogReader

    h = Health(read_at=int(time.time() * 1000))
    try:
        marker = store.marker()
        h.marker = "missing" if marker is None else marker.state
        h.rebuild_locked = store.rebuild_locked()
        h.counts = {s.value: n for s, n in store.counts().items()}
    except (RunlogError, redis.RedisError) as err:
        h.errors.append(f"redis: {err}")
    try:
        # one assigned, never-committing consumer for every watermark and the newest dead letters
        with LogReader(settings, Topics.of(settings).dlq, name="runlog-console", poll_timeout=0.5,
                       timeout=timeout) as r:
            _kafka_health(h, settings, admin, r, projector_groups, timeout, dead_letters_shown)
    except (KafkaException, RunlogError) as err:
        h.errors.append(f"kafka: {err}")
    return h
