"""The queues' dispatch policy against the real Redis scripts: weighted fair shares between tenants, a
newly active tenant neither starved nor bursting, priorities, the fleet's and a tenant's concurrency,
expiry of a dead worker's slots, idempotent queuing, why a run waits, one hash tag per queue."""

from __future__ import annotations

import time
from collections import Counter

import pytest
import redis

from runlog.processors.fleet._queues import Dispatched, RedisQueues, all_queues, where_waits
from runlog.producers import Queue
from runlog.schemas import Settings

pytestmark = pytest.mark.integration

Q = "q"


def _queues(settings: Settings, client: redis.Redis, queue: Queue | None = None, *, owner: str = "w1",
            ttl_ms: int = 10_000) -> RedisQueues:
    qs = RedisQueues(client, settings.redis_prefix, "g", ttl_ms=ttl_ms, owner=owner)
    qs.declare(queue or Queue(Q))
    return qs


def _fill(qs: RedisQueues, tenant: str, n: int, *, priority: int = 0, t0: int = 1_000) -> list[str]:
    ids = [f"{tenant}-{i:04d}" for i in range(n)]
    for i, run in enumerate(ids):
        assert qs.enqueue(Q, run, tenant, priority, t0 + i, b"rec-" + run.encode())
    return ids


def _take(qs: RedisQueues, *, release: bool = True) -> Dispatched:
    got = qs.dispatch(Q)
    assert isinstance(got, Dispatched), got
    if release:
        assert qs.release(Q, got.run_id)
    return got


def test_starts_are_shared_by_weight_while_every_tenant_waits(settings: Settings,
                                                               redis_client: redis.Redis) -> None:
    qs = _queues(settings, redis_client, Queue(Q, weights={"c": 2}))
    for t in "abc":
        _fill(qs, t, 100)
    starts = Counter(_take(qs).tenant for _ in range(200))
    assert starts == {"a": 50, "b": 50, "c": 100}
    stats = qs.stats(Q)
    assert stats.pending == {"a": 50, "b": 50} and stats.running == {}
    assert (round(stats.share("a"), 2), round(stats.share("c"), 2)) == (0.25, 0.5)


def test_a_tenant_with_ten_runs_is_not_starved_by_one_with_thousands_nor_bursts_past_it(
        settings: Settings, redis_client: redis.Redis) -> None:
    qs = _queues(settings, redis_client)
    _fill(qs, "big", 1000)
    for _ in range(300):  # big alone for a while: its virtual time runs ahead
        _take(qs)
    _fill(qs, "small", 10, t0=5_000)
    order = [_take(qs).tenant for _ in range(20)]
    # the newcomer starts at the lowest active virtual time: turn and turn about, no credit banked
    assert order.count("small") == 10 and order.count("big") == 10
    assert all(order[i] != order[i + 1] for i in range(19)), order


def test_higher_priority_first_then_submission_time_within_and_across_tenants(
        settings: Settings, redis_client: redis.Redis) -> None:
    qs = _queues(settings, redis_client)
    assert qs.enqueue(Q, "a-late", "a", 0, 3_000, b"x")
    assert qs.enqueue(Q, "a-early", "a", 0, 1_000, b"x")
    assert qs.enqueue(Q, "a-urgent", "a", 5, 4_000, b"x")
    assert qs.enqueue(Q, "b-high", "b", 9, 5_000, b"x")
    assert qs.enqueue(Q, "b-low", "b", -1, 500, b"x")
    order = [_take(qs).run_id for _ in range(5)]
    assert order == ["b-high", "a-urgent", "a-early", "a-late", "b-low"]


def test_the_fleet_wide_and_the_tenant_concurrency_are_never_exceeded(
        settings: Settings, redis_client: redis.Redis) -> None:
    qs = _queues(settings, redis_client, Queue(Q, concurrency=3, per_tenant=2))
    _fill(qs, "a", 5)
    held = [_take(qs, release=False), _take(qs, release=False)]
    assert qs.dispatch(Q) == "tenant"  # a holds its two; nobody else waits
    assert where_waits(redis_client, settings.redis_prefix, "a-0002") is not None
    wait = where_waits(redis_client, settings.redis_prefix, "a-0002")
    assert wait is not None and (wait.reason, wait.tenant, wait.ahead) == ("tenant", "a", 0)
    _fill(qs, "b", 3)
    held.append(_take(qs, release=False))
    assert held[-1].tenant == "b"
    assert qs.dispatch(Q) == "global"
    wait = where_waits(redis_client, settings.redis_prefix, "b-0002")
    assert wait is not None and (wait.reason, wait.ahead) == ("global", 1)
    assert "concurrency is taken" in wait.describe()
    assert qs.stats(Q).running == {"a": 2, "b": 1}
    assert qs.release(Q, held[0].run_id)
    # a has room again and the lower virtual time (b joined at a's, then started once)
    assert _take(qs, release=False).tenant == "a"
    assert qs.dispatch(Q) == "global"
    assert where_waits(redis_client, settings.redis_prefix, held[0].run_id) is None  # started: gone


def test_a_dead_workers_slots_expire_and_its_runs_wait_again(settings: Settings,
                                                             redis_client: redis.Redis) -> None:
    dead = _queues(settings, redis_client, Queue(Q, concurrency=1), owner="dead", ttl_ms=300)
    alive = _queues(settings, redis_client, Queue(Q, concurrency=1), owner="alive", ttl_ms=10_000)
    _fill(dead, "a", 2)
    got = _take(dead, release=False)
    wait = where_waits(redis_client, settings.redis_prefix, got.run_id)
    assert wait is not None and (wait.reason, wait.tenant) == ("dispatched", "a")  # a worker starts it
    assert "starting it" in wait.describe()
    assert alive.dispatch(Q) == "global"
    time.sleep(0.15)
    assert dead.refresh(Q, [got.run_id]) == 1  # a live worker keeps its slot
    time.sleep(0.2)
    assert alive.dispatch(Q) == "global"
    time.sleep(0.4)  # no refresh: the slot expires, the run waits again at its place
    again = alive.dispatch(Q)
    assert isinstance(again, Dispatched) and again.run_id == got.run_id and again.record == got.record
    assert not dead.release(Q, got.run_id)  # not the dead worker's slot any more
    wait = where_waits(redis_client, settings.redis_prefix, got.run_id)
    assert wait is not None and wait.reason == "dispatched"  # alive is starting it
    assert dead.refresh(Q, [got.run_id]) == 0
    assert alive.stats(Q).running == {"a": 1}
    assert alive.release(Q, got.run_id)
    assert alive.stats(Q).running == {}
    assert where_waits(redis_client, settings.redis_prefix, got.run_id) is None  # started: gone


def test_queuing_is_idempotent_and_a_run_put_back_waits_first(settings: Settings,
                                                              redis_client: redis.Redis) -> None:
    qs = _queues(settings, redis_client)
    _fill(qs, "a", 3)
    assert not qs.enqueue(Q, "a-0001", "a", 0, 1_001, b"again")  # pending already
    got = _take(qs, release=False)
    assert got.run_id == "a-0000"
    assert not qs.enqueue(Q, "a-0000", "a", 0, 1_000, b"again")  # running
    assert qs.release(Q, "a-0000", mode="again")  # could not start now
    assert _take(qs).run_id == "a-0000"
    assert not qs.enqueue(Q, "a-0000", "a", 0, 1_000, b"again")  # started within the day
    assert [_take(qs).run_id for _ in range(2)] == ["a-0001", "a-0002"]
    assert qs.dispatch(Q) == "empty"


def test_every_key_a_script_touches_is_in_the_queues_slot(settings: Settings,
                                                          redis_client: redis.Redis) -> None:
    qs = _queues(settings, redis_client, Queue(Q, concurrency=2, per_tenant=1, weights={"b": 3}))
    _fill(qs, "a", 2)
    _fill(qs, "b", 2)
    _take(qs, release=False)
    keys = sorted(k.decode() for k in redis_client.scan_iter(match=f"{settings.redis_prefix}:queues:*"))
    # the status index and the list of tags are no script's
    scripted = [k for k in keys if ":queues:at:" not in k and not k.endswith(":queues:tags")]
    assert len(scripted) >= 10
    assert {k[k.index("{") + 1:k.index("}")] for k in scripted} == {"g|q"}
    [stats] = all_queues(redis_client, settings.redis_prefix)
    assert (stats.group, stats.name, stats.concurrency, stats.per_tenant, stats.weights) == (
        "g", "q", 2, 1, {"b": 3.0})
    assert qs.flush(Q) == len(scripted)
    [empty] = all_queues(redis_client, settings.redis_prefix)
    assert (empty.concurrency, empty.pending, empty.running) == (None, {}, {})
