"""``RUNLOG_REDIS_WAIT_REPLICAS`` on a standalone server (the local one has no replica): ``auto``
leaves its applies as they were, a number makes each apply wait for that many replicas and fail
(``ReplicasBehind``) when they are not there; the batch stays kept for the retry."""

from __future__ import annotations

import pytest
import redis

from runlog.projections import RedisStore
from runlog.projections._replicas import ReplicasBehind
from runlog.schemas import Settings
from tests.unit.projections.runlogs import full_run
from tests.unit.projections.store_contract import fold_updates

pytestmark = pytest.mark.integration


def test_auto_does_not_wait_on_a_standalone_server(settings: Settings, redis_client: redis.Redis) -> None:
    store = RedisStore.from_settings(settings)
    assert settings.redis_wait_replicas is None and not store.waits.enabled
    ups = fold_updates(full_run("run-1", stages=1))
    assert len(store.apply(ups)) == len(ups)
    store.client.close()


def test_a_number_of_replicas_the_server_has_not_fails_the_apply_and_keeps_the_batch(
        settings: Settings, redis_client: redis.Redis) -> None:
    store = RedisStore.from_settings(settings.with_(redis_wait_replicas=1, redis_wait_ms=50))
    ups = fold_updates(full_run("run-2", stages=1))
    with pytest.raises(ReplicasBehind, match="the Redis server was answered by 0 of 1 replicas within 50 ms"):
        store.apply(ups)
    assert store.load_state("run-2") is not None  # written, not known to be replicated
    with pytest.raises(ReplicasBehind):
        store.apply([])  # the retry sends the kept batch again, which waits again
    store.client.close()
