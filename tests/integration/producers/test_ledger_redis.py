"""The Redis effects ledger passes the shared contract, and falls back to the projected index."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis

from producers._ledger import RedisEffectLedger
from schemas import EffectStatus, Settings
from tests.unit.producers.ledger_contract import DK, LedgerContract, entry

pytestmark = pytest.mark.integration


class TestRedisLedger(LedgerContract):
    @pytest.fixture(autouse=True)
    def _ledger(self, settings: Settings, redis_client: redis.Redis) -> Iterator[None]:
        self.ledger = RedisEffectLedger(redis_client, settings.redis_prefix)
        yield


def test_a_key_only_the_projection_knows_is_answered_from_it(
        settings: Settings, redis_client: redis.Redis) -> None:
    ledger = RedisEffectLedger(redis_client, settings.redis_prefix)
    redis_client.hset(ledger.index_key, DK, json.dumps(
        {"delivery_key": DK, "run_id": "run-old", "status": "DONE", "external_id": "ext-old",
         "call_id": "s/t/0", "target": "x", "seq": 9, "updated_at": 1}))
    other = ledger.open(entry("run-new"))
    assert other is not None and other.done and other.source == "projection"
    assert other.external_id == "ext-old"
    assert redis_client.get(ledger.claim_key(DK)) is None  # nothing claimed on its behalf
    found = ledger.lookup(DK)
    assert found is not None and found.status is EffectStatus.DONE


def test_claims_live_in_the_delivery_keys_slot(settings: Settings, redis_client: redis.Redis) -> None:
    ledger = RedisEffectLedger(redis_client, settings.redis_prefix)
    assert ledger.claim_key(DK) == f"{settings.redis_prefix}:{{{DK}}}:effect"
