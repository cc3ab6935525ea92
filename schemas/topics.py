"""Topic names and the configuration Runlog needs of each (docs/concepts/log.md, "Topics")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from runlog.schemas.settings import Settings

__all__ = ["TopicSpec", "Topics", "murmur2", "partition_for"]


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """A topic as Runlog creates it: name, partitions, replication, configs."""

    name: str
    partitions: int
    replication_factor: int
    config: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Topics:
    """The names of Runlog's topics under a prefix."""

    prefix: str = ""

    @property
    def events(self) -> str:
        return f"{self.prefix}runlog.events"

    @property
    def checkpoints(self) -> str:
        return f"{self.prefix}runlog.checkpoints"

    @property
    def effects(self) -> str:
        return f"{self.prefix}runlog.effects"

    @property
    def resume(self) -> str:
        return f"{self.prefix}runlog.resume"

    @property
    def submissions(self) -> str:
        return f"{self.prefix}runlog.submissions"

    @property
    def streams(self) -> str:
        return f"{self.prefix}runlog.streams"

    @property
    def schemas(self) -> str:
        """The schema log: every writer schema by fingerprint (:mod:`runlog.schemas._schema_log`)."""
        return f"{self.prefix}runlog.schemas"

    @property
    def schedules(self) -> str:
        return f"{self.prefix}runlog.schedules"

    @property
    def dlq(self) -> str:
        return f"{self.prefix}runlog.events.dlq"

    @classmethod
    def of(cls, settings: Settings) -> Topics:
        return cls(settings.topic_prefix)

    def specs(self, settings: Settings) -> tuple[TopicSpec, ...]:
        """Every topic with the configuration ``runlog init`` creates and checks."""
        p, rf = settings.partitions, settings.replication_factor
        isr = str(settings.min_insync_replicas)
        delete = {"cleanup.policy": "delete", "min.insync.replicas": isr}
        compact = {
            "cleanup.policy": "compact",
            "min.insync.replicas": isr,
            "min.compaction.lag.ms": "60000",
        }
        return (
            TopicSpec(
                self.events,
                p,
                rf,
                {**delete, "retention.ms": str(settings.events_retention_ms),
                 "retention.bytes": "-1"},
            ),
            TopicSpec(self.checkpoints, p, rf, compact),
            TopicSpec(self.effects, p, rf, compact),
            TopicSpec(self.resume, p, rf, {**delete, "retention.ms": str(7 * 24 * 3600 * 1000)}),
            TopicSpec(self.streams, p, rf, {**delete, "retention.ms": str(settings.streams_retention_ms)}),
            # what was asked, kept as long as the events (what pending submissions are is derived from both)
            TopicSpec(self.submissions, p, rf, {**delete, "retention.ms": str(settings.events_retention_ms)}),
            TopicSpec(self.dlq, p, rf, {**delete, "retention.ms": str(30 * 24 * 3600 * 1000)}),
            TopicSpec(self.schemas, 1, rf, {"cleanup.policy": "compact", "min.insync.replicas": isr}),
            TopicSpec(self.schedules, 1, rf, compact),
        )


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash (the Java client's default partitioner), as an unsigned 32-bit int."""
    m, r, mask = 0x5BD1E995, 24, 0xFFFFFFFF
    length = len(data)
    h = (0x9747B28C ^ length) & mask
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * m) & mask
        k ^= k >> r
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    tail = length % 4
    idx = length - tail
    if tail == 3:
        h ^= data[idx + 2] << 16
    if tail >= 2:
        h ^= data[idx + 1] << 8
    if tail >= 1:
        h ^= data[idx]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h


def partition_for(key: str, partitions: int) -> int:
    """The partition Runlog's producers (``partitioner=murmur2_random``) put a run id on."""
    return (murmur2(key.encode("utf-8")) & 0x7FFFFFFF) % partitions
