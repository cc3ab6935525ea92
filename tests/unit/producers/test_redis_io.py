"""The two drivers of the Redis ports' protocols (runlog.producers.base._redis_io), on fake clients."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest
import redis
import redis.asyncio

from runlog.producers.base._redis_io import RoundTrip, Steps, arun, run


class FakeClient:
    """Answers ``get`` from a dict (``broken`` keys raise ConnectionError); records what it was asked."""

    def __init__(self, data: dict[str, str], broken: frozenset[str] = frozenset()) -> None:
        self.data, self.broken = data, broken
        self.asked: list[str] = []

    def get(self, key: str) -> str | None:
        self.asked.append(key)
        if key in self.broken:
            raise redis.ConnectionError(f"{key} is down")
        return self.data.get(key)


class FakeAsyncClient(FakeClient):
    async def get(self, key: str) -> str | None:  # type: ignore[override]
        await asyncio.sleep(0)  # a real suspension
        return FakeClient.get(self, key)


def _protocol(keys: list[str]) -> Steps[list[str]]:
    """Read every key; a failed read counts as ``"?"`` (the protocol handles errors itself)."""
    out = []
    for k in keys:
        try:
            out.append((yield from RoundTrip(lambda c, k=k: c.get(k))) or "-")
        except redis.RedisError:
            out.append("?")
    return out


def _unguarded() -> Steps[str]:
    got = yield from RoundTrip(lambda c: c.get("down"))
    return str(got)


def _no_steps() -> Steps[int]:
    return 7
    yield  # a generator all the same


def test_both_drivers_send_answers_back_and_throw_errors_in() -> None:
    sync = FakeClient({"a": "1"}, frozenset({"down"}))
    aio = FakeAsyncClient({"a": "1"}, frozenset({"down"}))
    keys = ["a", "down", "b"]
    assert run(_protocol(keys), cast(redis.Redis, sync)) == ["1", "?", "-"]
    assert asyncio.run(arun(_protocol(keys), cast(redis.asyncio.Redis, aio), cast(redis.Redis, None))) \
        == ["1", "?", "-"]
    assert sync.asked == aio.asked == keys


def test_an_error_the_protocol_does_not_handle_propagates() -> None:
    sync = FakeClient({}, frozenset({"down"}))
    with pytest.raises(redis.ConnectionError):
        run(_unguarded(), cast(redis.Redis, sync))
    with pytest.raises(redis.ConnectionError):
        asyncio.run(arun(_unguarded(), cast(redis.asyncio.Redis, FakeAsyncClient({}, frozenset({"down"}))),
                         cast(redis.Redis, sync)))


def test_a_protocol_may_return_before_any_round_trip() -> None:
    assert run(_no_steps(), cast(redis.Redis, None)) == 7
    assert asyncio.run(arun(_no_steps(), cast(redis.asyncio.Redis, None), cast(redis.Redis, None))) == 7


def test_without_an_asyncio_client_arun_runs_the_steps_on_the_sync_one() -> None:
    sync = FakeClient({"a": "1"})
    got = asyncio.run(arun(_protocol(["a"]), None, cast(redis.Redis, sync)))
    assert got == ["1"] and sync.asked == ["a"]

