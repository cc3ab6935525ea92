"""The SDK's durable claims wait for a replica (:func:`runlog.producers.base._redis_io.replicated`), with
a fake client and the real :class:`~runlog.projections._replicas.ReplicaWaits` (issue 38, item 6: before,
only the Redis Cluster integration tests noticed this ``WAIT`` gone)."""

from __future__ import annotations

from typing import Any

import pytest

from runlog.producers.base._redis_io import RoundTrip, replicated
from runlog.projections._replicas import ReplicasBehind, ReplicaWaits
from tests.unit.projections.test_replica_waits import Client


class Pipe:
    """A pipeline: records what is queued, answers with the client's scripted answers."""

    def __init__(self, client: FakeRedis) -> None:
        self.client = client
        self.queued: list[tuple[Any, ...]] = []
        self.reinitialize_counter = 0

    def execute_command(self, *args: Any, **kwargs: Any) -> None:
        target = kwargs.get("target_nodes")
        self.queued.append((*args, target.name) if target is not None else args)

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        assert raise_on_error is False  # a failed WAIT must be seen, not raised past the check
        self.client.sent.append(self.queued)
        return self.client.answers(self.queued)


class FakeRedis:
    def __init__(self, replicas_acked: int) -> None:
        self.replicas_acked = replicas_acked
        self.sent: list[list[tuple[Any, ...]]] = []
        self.plain: list[str] = []

    def pipeline(self, transaction: bool = True) -> Pipe:
        assert transaction is False
        return Pipe(self)

    def answers(self, queued: list[tuple[Any, ...]]) -> list[Any]:
        return [self.replicas_acked if q[0] == "WAIT" else f"ok {q[1]}" for q in queued]


def _claim(keys: list[str], waits: ReplicaWaits | None) -> tuple[RoundTrip, FakeRedis]:
    def fill(pipe: Any) -> None:
        for k in keys:
            pipe.execute_command("SET", k, "claimed")

    client = FakeRedis(replicas_acked=1)
    plain = RoundTrip(lambda c: c.plain.append("plain") or "plain answer")
    return replicated(plain, fill, keys, waits, client), client


def _waits(replicas: int) -> ReplicaWaits:
    return ReplicaWaits(Client(), cluster=True, replicas=replicas, timeout_ms=250)


def test_a_claim_waits_on_each_primary_it_wrote_to_after_its_writes_and_answers_the_first_write() -> None:
    step, client = _claim(["a:lease", "c:ledger"], _waits(1))
    assert step.fn(client) == "ok a:lease"
    assert client.sent == [[("SET", "a:lease", "claimed"), ("SET", "c:ledger", "claimed"),
                            ("WAIT", 1, 250, "a"), ("WAIT", 1, 250, "c")]]
    assert client.plain == []


def test_a_claim_no_replica_acknowledged_in_time_fails() -> None:
    step, client = _claim(["a:lease"], _waits(1))
    client.replicas_acked = 0
    with pytest.raises(ReplicasBehind, match="node a was answered by 0 of 1 replicas"):
        step.fn(client)


def test_without_waits_the_plain_write_is_made() -> None:
    for waits in (None, _waits(0)):
        step, client = _claim(["a:lease"], waits)
        assert step.fn(client) == "plain answer"
        assert client.plain == ["plain"] and client.sent == []
