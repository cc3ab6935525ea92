"""The Redis lease passes the shared lease contract."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from producers._lease import RedisLeaseManager
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
