"""Small confluent-kafka helpers every reader shares: watermarks that survive a leader moving, the
events topic's partition count, and which commit errors only mean the consumer group moved on."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from runlog.schemas._kafka_auth import served
from runlog.schemas.errors import ConfigError, LogUnavailable, RunlogError
from runlog.schemas.settings import Settings
from runlog.schemas.topics import Topics

__all__ = ["REBALANCE_COMMIT_ERRORS", "RETRIABLE_METADATA_ERRORS", "commit_refused_by_rebalance",
           "partitions_of", "watermarks"]

RETRIABLE_METADATA_ERRORS = frozenset({
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,  # every connection dropped at once (a process resumed after a pause)
    KafkaError._TIMED_OUT,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError.FENCED_LEADER_EPOCH,
    KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError._UNKNOWN_PARTITION,  # the client's metadata lost the partition (its connections reset)
    KafkaError._DESTROY_BROKER,  # the broker's handle was replaced while the request waited (a restart)
})
"""Errors a metadata or offset request gets while a just-created topic elects its leaders, or a
partition's leadership moves: worth asking again until the deadline."""


REBALANCE_COMMIT_ERRORS = frozenset({
    KafkaError.ILLEGAL_GENERATION,  # a rebalance gave the group a new generation since the poll
    KafkaError.REBALANCE_IN_PROGRESS,
    KafkaError.UNKNOWN_MEMBER_ID,  # this member was removed from the group (session timed out, ...)
    KafkaError.FENCED_INSTANCE_ID,  # a member with the same group.instance.id replaced this one
    KafkaError.STALE_MEMBER_EPOCH,  # the KIP-848 group protocol: this member is behind, or fenced
    KafkaError.FENCED_MEMBER_EPOCH,
    KafkaError._ASSIGNMENT_LOST,  # librdkafka: the partitions were lost before the commit was sent
    KafkaError._MAX_POLL_EXCEEDED,  # the member left the group: max.poll.interval.ms passed in one request
    KafkaError._NO_OFFSET,  # nothing left to commit (the partition is no longer ours)
    # the group's coordinator is moving (a broker restarting, its leadership of the offsets
    # partition failing over): this commit is not stored, a later one covers it
    KafkaError._WAIT_COORD,
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
})
"""Commit errors that only say the group moved on since the record was polled (a member joined,
left or was replaced, or this one was dropped), or that its coordinator is moving: the offset is
not stored, and the partition's owner gets the record again from the last committed offset unless
a later commit covers it. Work that is idempotent treats this as ordinary (the DESIGN's "Members
come and go") and goes on; every other commit error is a real failure."""


def commit_refused_by_rebalance(err: BaseException) -> bool:
    """Whether ``err`` (a ``KafkaException`` from ``Consumer.commit``) is a commit refused because
    the consumer group moved on (:data:`REBALANCE_COMMIT_ERRORS`), not a real failure."""
    return isinstance(err, KafkaException) and _code(err) in REBALANCE_COMMIT_ERRORS


def _code(err: KafkaException) -> int | None:
    kerr = err.args[0] if err.args else None
    return kerr.code() if isinstance(kerr, KafkaError) else None


_MISSING = "does it exist? check RUNLOG_TOPIC_PREFIX, or create the topics with `runlog init`"
"""What a topic that stays unknown to the brokers may mean, said with the error."""


def watermarks(
    consumer: Any, topic: str, partitions: list[int] | None = None, timeout: float = 10.0
) -> dict[int, tuple[int, int]]:
    """``{partition: (low, high)}`` of ``topic`` (all partitions unless given).

    A request that meets a leader election (a topic created a moment ago, a broker restarting)
    or lost connections is asked again with a short backoff until ``timeout``; past the deadline
    :class:`~runlog.schemas.errors.LogUnavailable` is raised, any other error :class:`RunlogError`, both
    naming the topic.
    """
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        left = max(deadline - time.monotonic(), 0.1)
        try:
            if partitions is None:
                md = served(consumer, lambda t: consumer.list_topics(topic, timeout=t), left)
                tmd = md.topics.get(topic)
                if tmd is None or (tmd.error is not None and tmd.error.code() not in
                                   RETRIABLE_METADATA_ERRORS):
                    raise RunlogError(f"topic {topic!r} not found")
                parts = sorted(tmd.partitions) if tmd.error is None and tmd.partitions else []
                unknown = tmd.error is not None and tmd.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
            else:
                parts, unknown = list(partitions), False
            if parts:
                return {p: _watermark(consumer, TopicPartition(topic, p), left) for p in parts}
            last: str = f"the brokers do not know this topic ({_MISSING})" if unknown else \
                "no partitions in metadata yet"
        except KafkaException as err:
            if _code(err) not in RETRIABLE_METADATA_ERRORS:
                raise RunlogError(f"reading watermarks of {topic!r} failed: {err}") from err
            last = str(err)
            if _code(err) in (KafkaError._UNKNOWN_PARTITION, KafkaError.UNKNOWN_TOPIC_OR_PART):
                last += f" ({_MISSING})"
        if time.monotonic() + delay > deadline:
            raise LogUnavailable(f"reading watermarks of {topic!r} failed: {last}")
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


def _watermark(consumer: Any, tp: TopicPartition, timeout: float) -> tuple[int, int]:
    got: tuple[int, int] = served(consumer, lambda t: consumer.get_watermark_offsets(tp, timeout=t), timeout)
    return got


def partitions_of(settings: Settings, *, fallback: bool = False) -> int:
    """The events topic's partition count, asked of the broker.

    A topic the broker does not report raises :class:`ConfigError` naming it; with ``fallback``,
    ``settings.partitions`` (the count Runlog creates it with) is returned instead. Brokers that
    do not answer within 10 s raise :class:`~runlog.schemas.errors.LogUnavailable`.
    """
    from confluent_kafka.admin import AdminClient

    topic = Topics.of(settings).events
    admin = AdminClient(settings.admin_config())
    try:
        md = served(admin, lambda t: admin.list_topics(topic, timeout=t), 10)
    except KafkaException as err:
        if _code(err) in RETRIABLE_METADATA_ERRORS:
            raise LogUnavailable(f"reading the partitions of {topic!r} failed: {err}") from err
        raise RunlogError(f"reading the partitions of {topic!r} failed: {err}") from err
    t = md.topics.get(topic)
    if t is None or t.error is not None or not t.partitions:
        if fallback:
            return settings.partitions
        raise ConfigError(f"the events topic {topic} does not exist on {settings.kafka_bootstrap_servers} "
                          "(check RUNLOG_TOPIC_PREFIX, or create the topics with `runlog init`)")
    return len(t.partitions)
