"""The Redis lease adapters (sync and asyncio) under the lease contract, for any Redis client: a
test module subclasses these once per deployment (standalone, cluster) and gives them the client
through its ``_redis`` / ``_aclient`` fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from runlog.producers.log._lease import AsyncRedisLeaseManager, RedisLeaseManager
from runlog.schemas import Settings
from tests.unit.producers.lease_contract import LeaseContract


class RedisLeaseCase(LeaseContract):
    """The sync adapter; a subclass sets ``settings`` and ``client`` in an autouse ``_redis``."""

    settings: Settings
    client: Any

    @pytest.fixture(autouse=True)
    def _managers(self) -> Iterator[None]:
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


class AsyncRedisLeaseCase(RedisLeaseCase):
    """The asyncio adapter; a subclass also sets ``aclient`` in an autouse ``_aclient``."""

    aclient: Any

    def manager(self, holder: str) -> AsyncRedisLeaseManager:
        m = AsyncRedisLeaseManager(self.client, self.aclient, self.settings, holder=holder)
        self.managers.append(m)
        return m

    async def aclean(self) -> None:
        for m in self.managers:
            await m.aclose()
        await self.aclient.aclose()
