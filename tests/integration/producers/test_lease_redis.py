"""The Redis lease passes the shared lease contract, on both faces.

``TestRedisLease``: the thread-heartbeat manager (its async face falls back to the sync calls).
``TestAsyncRedisLease``: :class:`AsyncRedisLeaseManager`, whose async face awaits redis-py's
asyncio client (its sync face, acquire with a heartbeat thread, runs the contract too).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
import redis.asyncio

from producers._lease import AsyncRedisLeaseManager, RedisLeaseManager
from schemas import Settings
from tests.unit.producers.lease_contract import LeaseContract

pytestmark = pytest.mark.integration


class TestRedisLease(LeaseContract):
    @pytest.fixture(autouse=True)
    def _redis(self, settings: Settings, redis_client: redis.Redis) -> Iterator[None]:
        self.settings, self.client = settings, redis_client
        self.managers: list[RedisLeaseManager] = []
        yield
        for m in self.managers:
            m.close()

    def manager(self, holder: str) -> RedisLeaseManager:
        m = RedisLeaseManager(self.client, self.settings, holder=holder)
        self.managers.append(m)
        return m

    def expire(self, run_id: str) -> None:
        self.client.delete(RedisLeaseManager(self.client, self.settings).lease_key(run_id))


class TestAsyncRedisLease(TestRedisLease):
    @pytest.fixture(autouse=True)
    def _aclient(self, _redis: None) -> None:
        self.aclient = redis.asyncio.Redis.from_url(self.settings.redis_url)

    def manager(self, holder: str) -> AsyncRedisLeaseManager:
        m = AsyncRedisLeaseManager(self.client, self.aclient, self.settings, holder=holder)
        self.managers.append(m)
        return m

    async def aclean(self) -> None:
        for m in self.managers:
            await m.aclose()
        await self.aclient.aclose()
