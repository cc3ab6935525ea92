"""The writer-side registry of active runs (``P:runs:active``) against a real Redis."""

from __future__ import annotations

import time

import pytest
import redis

from producers._active import ActiveRuns
from schemas import Settings

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
