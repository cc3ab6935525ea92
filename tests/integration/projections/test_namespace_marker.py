"""The namespace marker and the rebuild lock on their own, on real Redis (the moves are Lua scripts)."""

from __future__ import annotations

import pytest
import redis

from runlog.projections._marker import READY, REBUILDING, REPLAYING
from runlog.projections._marker_store import NamespaceMarker
from runlog.schemas import Settings

pytestmark = pytest.mark.integration


@pytest.fixture
def ns(settings: Settings, redis_client: redis.Redis) -> NamespaceMarker:
    return NamespaceMarker(redis_client, settings.redis_prefix)


def test_a_replay_marks_a_new_namespace_until_its_offsets_then_ready(
        ns: NamespaceMarker, settings: Settings, redis_client: redis.Redis) -> None:
    gen = ns.begin_replay({1: 40, 0: 12})
    assert gen is not None and ns.held == gen
    assert NamespaceMarker(redis_client, settings.redis_prefix).begin_replay({0: 1}) is None  # one wins
    assert ns.replay_until() == (gen, {0: 12, 1: 40})
    assert not ns.finish_replay("another-gen") and ns.finish_replay(gen)
    m = ns.marker()
    assert m is not None and (m.gen, m.state) == (gen, READY) and ns.replay_until() is None


def test_a_rebuild_holds_the_lock_under_a_new_generation_and_voids_the_others(
        ns: NamespaceMarker, settings: Settings, redis_client: redis.Redis) -> None:
    writer = NamespaceMarker(redis_client, settings.redis_prefix)
    old = writer.generation
    gen = ns.begin_rebuild("me", ttl_ms=5000)
    assert gen is not None and gen != old and ns.held == gen
    assert ns.begin_rebuild("other") is None and ns.rebuild_locked()
    assert ns.hold_rebuild("me") and not ns.hold_rebuild("other")
    m = ns.marker()
    assert m is not None and (m.gen, m.state) == (gen, REBUILDING)
    ns.finish_rebuild("me", gen)
    assert not ns.rebuild_locked()
    m = ns.marker()
    assert m is not None and (m.gen, m.state) == (gen, READY)
    assert not writer.invalidate() and writer.held is None  # the marker moved on from its generation
    assert ns.invalidate() and ns.marker() is None


def test_an_abandoned_rebuild_releases_the_lock_and_forgets_its_generation(ns: NamespaceMarker) -> None:
    assert ns.begin_rebuild("me") is not None
    ns.abandon_rebuild("me")
    assert not ns.rebuild_locked() and ns.held is None
    m = ns.marker()
    assert m is not None and m.state == REBUILDING  # not whole: the next recover rebuilds it


def test_the_marker_is_replaying_only_while_a_replay_runs(ns: NamespaceMarker) -> None:
    gen = ns.begin_replay({0: 3})
    m = ns.marker()
    assert m is not None and (m.gen, m.state) == (gen, REPLAYING)
