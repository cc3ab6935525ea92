"""The writer-side registry of active runs (``P:runs:active``) against a real Redis."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from runlog.producers.run._active import ActiveRuns
from runlog.schemas import Settings
from tests.unit.producers.faces import OnLoop

pytestmark = pytest.mark.integration


def test_add_list_remove(settings: Settings, redis_client: redis.Redis) -> None:
    active = ActiveRuns(redis_client, settings.redis_prefix)
    assert active.list() == []
    before = int(time.time() * 1000)
    active.add("run-b", "beta")
    active.add("run-a", "alpha", at_ms=1)
    assert active.list() == [("run-a", "alpha"), ("run-b", "beta")]  # oldest add first
    score = redis_client.zscore(f"{settings.redis_prefix}:runs:active", "run-b")
    assert score is not None and score >= before
    assert redis_client.hget(f"{settings.redis_prefix}:runs:active:workflow", "run-a") == b"alpha"
    assert "run-a" in active and "run-x" not in active

    active.add("run-a", "alpha", at_ms=int(score) + 1)  # a resume adds again: refreshed, not duplicated
    # (explicit time: two adds within one millisecond tie, and ties list by run id)
    assert active.list() == [("run-b", "beta"), ("run-a", "alpha")]

    active.remove("run-b")
    active.remove("run-b")  # removing twice is harmless
    active.remove("run-never")
    assert active.list() == [("run-a", "alpha")]
    assert redis_client.hget(f"{settings.redis_prefix}:runs:active:workflow", "run-b") is None


def test_a_member_without_workflow_entry_lists_with_an_empty_name(
        settings: Settings, redis_client: redis.Redis) -> None:
    active = ActiveRuns(redis_client, settings.redis_prefix)
    redis_client.zadd(active.key, {"run-orphan": 5})  # e.g. an add interrupted by a crash elsewhere
    assert active.list() == [("run-orphan", "")]
    active.add("run-orphan", "alpha")
    assert active.list() == [("run-orphan", "alpha")]


def test_the_async_face_updates_the_sets_on_the_asyncio_client(
        settings: Settings, redis_client: redis.Redis) -> None:
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)  # any sync call fails
    sync = ActiveRuns(redis_client, settings.redis_prefix)
    loop = OnLoop(settings.redis_url)
    active = ActiveRuns(dead, settings.redis_prefix, aclient=loop.aclient)

    async def case() -> None:
        await active.aadd("run-b", "beta", at_ms=2)
        await active.aadd("run-a", "alpha", at_ms=1)
        await active.aadd("run-c", "gamma")
        assert sync.list() == [("run-a", "alpha"), ("run-b", "beta"), ("run-c", "gamma")]
        await active.await_("run-a", "alpha", 500)  # waits with a deadline
        await active.await_("run-b", "beta", 0)  # waits for its signal only
        assert sync.list() == [("run-c", "gamma")]
        assert sync.due(now_ms=1000) == [("run-a", "alpha")]
        assert sync.due(now_ms=499) == []
        assert redis_client.hget(sync.workflow_key, "run-b") is None
        await active.aremove("run-a")
        await active.aremove("run-a")  # twice is harmless
        await active.aremove("run-c")
        assert sync.list() == [] and sync.due(now_ms=1000) == []
        assert redis_client.hgetall(sync.workflow_key) == {}

    loop.run(case)


def test_without_an_asyncio_client_the_async_face_is_the_sync_one(
        settings: Settings, redis_client: redis.Redis) -> None:
    active = ActiveRuns(redis_client, settings.redis_prefix)

    async def main() -> None:
        await active.aadd("run-a", "alpha", at_ms=1)
        await active.aadd("run-b", "beta", at_ms=2)
        await active.await_("run-b", "beta", 7)
        await active.aremove("run-x")

    asyncio.run(main())
    assert active.list() == [("run-a", "alpha")]
    assert active.due(now_ms=7) == [("run-b", "beta")]
