"""Which commit errors only mean the consumer group moved on
(runlog.schemas._kafka.commit_refused_by_rebalance)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from runlog.schemas._kafka import commit_refused_by_rebalance


@pytest.mark.parametrize("code", [KafkaError.ILLEGAL_GENERATION, KafkaError.REBALANCE_IN_PROGRESS,
                                  KafkaError.UNKNOWN_MEMBER_ID, KafkaError.FENCED_INSTANCE_ID,
                                  KafkaError._ASSIGNMENT_LOST, KafkaError._MAX_POLL_EXCEEDED,
                                  KafkaError._NO_OFFSET])
def test_a_commit_refused_because_the_group_moved_on_is_ordinary(code: int) -> None:
    assert commit_refused_by_rebalance(KafkaException(KafkaError(code)))


@pytest.mark.parametrize("code", [KafkaError._TRANSPORT, KafkaError._TIMED_OUT,
                                  KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError.OFFSET_METADATA_TOO_LARGE,
                                  KafkaError.UNKNOWN_TOPIC_OR_PART])
def test_other_commit_errors_are_failures(code: int) -> None:
    assert not commit_refused_by_rebalance(KafkaException(KafkaError(code)))


def test_only_kafka_exceptions_qualify() -> None:
    assert not commit_refused_by_rebalance(RuntimeError("ILLEGAL_GENERATION"))
    assert not commit_refused_by_rebalance(KafkaException("no KafkaError inside"))


@pytest.mark.parametrize("code", [KafkaError._WAIT_COORD, KafkaError.NOT_COORDINATOR,
                                  KafkaError.COORDINATOR_NOT_AVAILABLE,
                                  KafkaError.COORDINATOR_LOAD_IN_PROGRESS])
def test_a_commit_refused_while_the_coordinator_moves_is_ordinary(code: int) -> None:
    """A chaos run's resumer exited on ``Commit failed: Local: Waiting for coordinator`` during a
    broker restart: the commit is not stored, a later one covers it (or the request comes again)."""
    assert commit_refused_by_rebalance(KafkaException(KafkaError(code)))
