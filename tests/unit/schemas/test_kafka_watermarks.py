"""``runlog.schemas._kafka.watermarks``: a leader election is waited out, anything else fails at once."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from runlog.schemas._kafka import watermarks
from runlog.schemas.errors import RunlogError


class _Consumer:
    def __init__(self, failures: list[int], partitions: int = 2) -> None:
        self.failures = list(failures)
        self.partitions = partitions
        self.calls = 0

    def list_topics(self, topic: str, timeout: float) -> Any:
        parts = {p: object() for p in range(self.partitions)}
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions=parts)})

    def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
        self.calls += 1
        if self.failures:
            raise KafkaException(KafkaError(self.failures.pop(0)))
        return (0, 10 + tp.partition)


def test_not_leader_is_asked_again_until_it_answers() -> None:
    c = _Consumer([KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE])
    assert watermarks(c, "t", timeout=5) == {0: (0, 10), 1: (0, 11)}
    assert c.calls == 4


def test_a_partition_the_clients_metadata_lost_while_its_connections_reset_is_asked_again() -> None:
    # what a resumer met during an hour of runlog chaos (a connection reset of its Kafka clients):
    # it exited on the RunlogError this raised before
    c = _Consumer([KafkaError._UNKNOWN_PARTITION])
    assert watermarks(c, "t", timeout=5) == {0: (0, 10), 1: (0, 11)}
    assert c.calls == 3


def test_a_broker_handle_destroyed_during_a_broker_restart_is_asked_again() -> None:
    # a chaos run's resumer exited on "Failed to get watermark offsets: Local: Broker handle
    # destroyed without termination" while the broker restarted
    c = _Consumer([KafkaError._DESTROY_BROKER])
    assert watermarks(c, "t", timeout=5) == {0: (0, 10), 1: (0, 11)}
    assert c.calls == 3


def test_a_non_retriable_error_fails_at_once_naming_the_topic() -> None:
    c = _Consumer([KafkaError.TOPIC_AUTHORIZATION_FAILED])
    with pytest.raises(RunlogError, match="'t'"):
        watermarks(c, "t", timeout=5)
    assert c.calls == 1


def test_the_deadline_ends_the_retries() -> None:
    c = _Consumer([KafkaError.NOT_LEADER_FOR_PARTITION] * 1000)
    with pytest.raises(RunlogError, match=r"Not leader|NOT_LEADER"):
        watermarks(c, "t", [0], timeout=0.3)
    assert 1 < c.calls < 1000
