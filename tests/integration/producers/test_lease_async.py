"""AsyncRedisLeaseManager against real Redis: the heartbeat is one thread that a blocked loop does
not delay, a takeover is seen by ``averify`` at once, and no sync round trip hides in the async
face (beyond the heartbeat thread's own connection)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from dataclasses import replace

import pytest
import redis
import redis.asyncio

from runlog.producers.log._lease import AsyncRedisLeaseManager, RedisLeaseManager
from runlog.schemas import Settings
from runlog.schemas.errors import LeaseLost
from tests.unit.producers.faces import OnLoop

pytestmark = pytest.mark.integration

HEARTBEAT = "runlog-lease-heartbeat"
TTL_MS = 600


def _heartbeat_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == HEARTBEAT}


def _heartbeat_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name() == HEARTBEAT and not t.done()]


def _ttls(settings: Settings, n: float) -> float:
    """``n`` lease ttls, in seconds."""
    return settings.lease_ttl_ms / 1000 * n


@pytest.fixture
def short(settings: Settings) -> Settings:
    return replace(settings, lease_ttl_ms=TTL_MS)


def test_the_heartbeat_is_one_thread_that_a_blocked_loop_does_not_delay(
        short: Settings, redis_client: redis.Redis) -> None:
    before = _heartbeat_threads()
    loop = OnLoop(short.redis_url)
    m = loop.closing(AsyncRedisLeaseManager(redis_client, loop.aclient, short, holder="a"))

    async def case() -> None:
        a = await m.aacquire("run-a")
        b = await m.aacquire("run-b")
        assert len(_heartbeat_threads() - before) == 1  # one thread for all the leases
        assert _heartbeat_tasks() == []
        # the loop is blocked (a saturated loop, thousands of runs) for four ttls: a heartbeat
        # on the loop would not run, the leases would expire in Redis and check() would fail
        time.sleep(_ttls(short, 4))
        for lease in (a, b):
            lease.check()  # heartbeaten within ttl - margin
            assert redis_client.get(lease.key) == lease.token.encode()
            assert 0 < redis_client.pttl(lease.key) <= short.lease_ttl_ms
            await lease.averify()
        await b.arelease()
        assert redis_client.get(b.key) is None
        await asyncio.sleep(_ttls(short, 2))  # a alone is still heartbeaten
        a.check()

        await m.aclose()
        assert _heartbeat_threads() <= before
        await asyncio.sleep(_ttls(short, 1) + 0.3)
        assert redis_client.get(a.key) is None  # no heartbeat: it ran out in Redis
        with pytest.raises(LeaseLost):
            a.check()  # and the holder knows it locally
        with pytest.raises(LeaseLost):
            await a.averify()

    loop.run(case)
    assert _heartbeat_threads() <= before


def test_a_takeover_makes_averify_raise_lease_lost_at_once(
        settings: Settings, redis_client: redis.Redis) -> None:
    run_id = f"run-{uuid.uuid4().hex}"
    loop = OnLoop(settings.redis_url)
    a = loop.closing(AsyncRedisLeaseManager(redis_client, loop.aclient, settings, holder="a"))
    b = loop.closing(AsyncRedisLeaseManager(redis_client, loop.aclient, settings, holder="b"))
    thief = loop.closing(RedisLeaseManager(redis_client, settings, holder="thief"))  # a sync writer

    async def case() -> None:
        lease = await a.aacquire(run_id)
        await lease.averify()
        taken = await b.aacquire(run_id, force=True)  # no heartbeat of a's ran since
        assert taken.epoch == 2
        with pytest.raises(LeaseLost) as info:
            await lease.averify()
        assert (info.value.run_id, info.value.epoch) == (run_id, 1)
        with pytest.raises(LeaseLost):
            lease.check()
        await lease.arelease()  # leaves b's lease alone
        assert redis_client.get(taken.key) == b"b|2"

        stolen = thief.acquire(run_id, force=True)
        with pytest.raises(LeaseLost):
            await taken.averify()
        stolen.release()

    loop.run(case)


def test_the_heartbeat_marks_a_taken_over_lease_lost(short: Settings, redis_client: redis.Redis) -> None:
    loop = OnLoop(short.redis_url)
    m = loop.closing(AsyncRedisLeaseManager(redis_client, loop.aclient, short, holder="a"))
    thief = loop.closing(RedisLeaseManager(redis_client, short, holder="thief"))

    async def case() -> None:
        lease = await m.aacquire("run-x")
        thief.acquire("run-x", force=True)
        await asyncio.sleep(_ttls(short, 1))  # three heartbeat periods, no call of ours
        assert lease.lost

    loop.run(case)


def test_the_async_face_makes_no_sync_round_trip(short: Settings, redis_client: redis.Redis) -> None:
    """With a sync client that cannot connect, aacquire, averify, arelease work, and the heartbeat
    beats on its own connection."""
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    loop = OnLoop(short.redis_url)
    m = loop.closing(AsyncRedisLeaseManager(dead, loop.aclient, short, holder="a",
                                            heartbeat_client=redis_client))

    async def case() -> None:
        lease = await m.aacquire("run-a", epoch=4)
        assert lease.epoch == 5
        await asyncio.sleep(_ttls(short, 2))
        lease.check()
        await lease.averify()
        await lease.arelease()
        assert redis_client.get(lease.key) is None

    loop.run(case)


def test_the_sync_face_of_the_async_manager_heartbeats_from_a_thread(
        short: Settings, redis_client: redis.Redis) -> None:
    aclient = redis.asyncio.Redis.from_url(short.redis_url)  # never used: nothing to close
    m = AsyncRedisLeaseManager(redis_client, aclient, short, holder="a")
    before = _heartbeat_threads()
    try:
        lease = m.acquire("run-a")
        assert len(_heartbeat_threads() - before) == 1
        time.sleep(_ttls(short, 3))
        lease.verify()
        lease.release()
    finally:
        m.close()
    assert _heartbeat_threads() <= before


def test_the_verifies_of_many_runs_on_one_loop_share_one_round_trip_each_answered_for_its_own_lease(
        settings: Settings, redis_client: redis.Redis) -> None:
    loop = OnLoop(settings.redis_url)
    m = loop.closing(AsyncRedisLeaseManager(redis_client, loop.aclient, settings, holder="a"))
    thief = loop.closing(RedisLeaseManager(redis_client, settings, holder="thief"))
    pipelines: list[int] = []
    real = loop.aclient.pipeline

    def counted(*args: object, **kwargs: object) -> object:
        pipelines.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    async def case() -> None:
        runs = [f"run-{uuid.uuid4().hex}" for _ in range(40)]
        leases = [await m.aacquire(r) for r in runs]
        stolen = thief.acquire(runs[7], force=True)  # one of them is taken over
        loop.aclient.pipeline = counted  # type: ignore[method-assign]
        redis_client.pexpire(leases[3].key, 1)  # another one's key runs out in Redis
        await asyncio.sleep(0.05)
        answers = await asyncio.gather(*(lease.averify() for lease in leases), return_exceptions=True)
        assert len(pipelines) == 1  # 40 verifies, one round trip
        lost = {i for i, a in enumerate(answers) if isinstance(a, LeaseLost)}
        assert lost == {3, 7} and all(a is None for i, a in enumerate(answers) if i not in lost)
        assert leases[7].lost and leases[3].lost and not leases[0].lost
        for i, lease in enumerate(leases):  # the others were extended: a full ttl again
            if i not in lost:
                assert redis_client.pttl(lease.key) > settings.lease_ttl_ms - 1000
        with pytest.raises(LeaseLost):  # and a lost one stays lost without asking Redis
            await leases[7].averify()
        assert len(pipelines) == 1
        stolen.release()
        for lease in leases:
            await lease.arelease()

    loop.run(case)
