"""The cluster clients wait out a master's failover: the errors redis-py retries at once (a few
times within milliseconds) are retried with backoff until the failover window has passed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
import redis.asyncio.cluster
import redis.cluster

from runlog.schemas._redis import AsyncFailoverCluster, FailoverCluster, redis_client
from runlog.schemas.settings import Settings


class Flaky:
    """``execute_command`` failing ``fails`` times with ``error``, then answering ``"OK"``."""

    def __init__(self, fails: int, error: Exception) -> None:
        self.fails, self.error, self.calls = fails, error, 0

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        self.calls += 1
        if self.calls <= self.fails:
            raise self.error
        return "OK"


def _sync(failover_s: float) -> FailoverCluster:
    c = FailoverCluster.__new__(FailoverCluster)  # no connection: only the retry loop is under test
    c.failover_s = failover_s
    return c


def test_a_failover_is_waited_out(monkeypatch: pytest.MonkeyPatch) -> None:
    flaky = Flaky(4, redis.ConnectionError("node down"))
    monkeypatch.setattr(redis.cluster.RedisCluster, "execute_command", lambda self, *a, **k: flaky(*a, **k))
    assert _sync(5.0).execute_command("GET", "k") == "OK"
    assert flaky.calls == 5


def test_past_the_window_the_error_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    flaky = Flaky(1_000, redis.exceptions.ClusterDownError("CLUSTERDOWN"))
    monkeypatch.setattr(redis.cluster.RedisCluster, "execute_command", lambda self, *a, **k: flaky(*a, **k))
    with pytest.raises(redis.exceptions.ClusterDownError):
        _sync(0.3).execute_command("GET", "k")
    assert 2 <= flaky.calls < 20  # backed off, not spun


def test_other_errors_are_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    flaky = Flaky(1, redis.ResponseError("WRONGTYPE"))
    monkeypatch.setattr(redis.cluster.RedisCluster, "execute_command", lambda self, *a, **k: flaky(*a, **k))
    with pytest.raises(redis.ResponseError):
        _sync(5.0).execute_command("GET", "k")
    assert flaky.calls == 1


def test_the_asyncio_client_waits_too(monkeypatch: pytest.MonkeyPatch) -> None:
    flaky = Flaky(3, redis.TimeoutError("slow"))

    async def call(self: Any, *a: Any, **k: Any) -> str:
        return flaky(*a, **k)

    monkeypatch.setattr(redis.asyncio.cluster.RedisCluster, "execute_command", call)
    c = AsyncFailoverCluster.__new__(AsyncFailoverCluster)
    c.failover_s = 5.0
    assert asyncio.run(c.execute_command("GET", "k")) == "OK" and flaky.calls == 4


def test_the_window_comes_from_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    made: dict[str, Any] = {}
    monkeypatch.setattr(redis.cluster.RedisCluster, "__init__", lambda self, *a, **k: made.update(k))
    s = Settings().with_(redis_url="redis+cluster://127.0.0.1:7000", redis_failover_ms=7_500)
    c = redis_client(s)
    assert isinstance(c, FailoverCluster) and c.failover_s == 7.5 and "startup_nodes" in made
    assert Settings.from_env({"RUNLOG_REDIS_FAILOVER_MS": "1200"}).redis_failover_ms == 1200


def test_a_pipelined_step_waits_out_a_failover_on_a_cluster_client() -> None:
    from runlog.producers.base._redis_io import pipelined

    class Pipe:
        def __init__(self, flaky: Flaky) -> None:
            self.flaky, self.queued = flaky, 0

        def incr(self, key: str) -> None:
            self.queued += 1

        def execute(self) -> list[int]:
            self.flaky()
            return [self.queued]

    class Client:
        def __init__(self, failover_s: float) -> None:
            self.failover_s, self.flaky = failover_s, Flaky(3, redis.ConnectionError("node down"))

        def pipeline(self, transaction: bool) -> Pipe:
            return Pipe(self.flaky)

    step = pipelined(lambda p: p.incr("k"))
    c = Client(5.0)
    assert step.fn(c) == [1] and c.flaky.calls == 4  # a fresh pipeline each attempt
    with pytest.raises(redis.ConnectionError):
        step.fn(Client(0.0))  # not a cluster client: no window, redis-py's own behaviour
