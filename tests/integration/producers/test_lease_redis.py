"""The Redis lease passes the shared lease contract, on both faces.

``TestRedisLease``: the thread-heartbeat manager (its async face falls back to the sync calls).
``TestAsyncRedisLease``: :class:`AsyncRedisLeaseManager`, whose async face awaits redis-py's
asyncio client (its sync face, acquire with a heartbeat thread, runs the contract too).
"""

from __future__ import annotations

import pytest
import redis
import redis.asyncio

from runlog.schemas import Settings
from tests.integration.producers.redis_lease_faces import AsyncRedisLeaseCase, RedisLeaseCase

pytestmark = pytest.mark.integration


class TestRedisLease(RedisLeaseCase):
    @pytest.fixture(autouse=True)
    def _redis(self, settings: Settings, redis_client: redis.Redis) -> None:
        self.settings, self.client = settings, redis_client


class TestAsyncRedisLease(AsyncRedisLeaseCase, TestRedisLease):
    @pytest.fixture(autouse=True)
    def _aclient(self, _redis: None) -> None:
        self.aclient = redis.asyncio.Redis.from_url(self.settings.redis_url)
