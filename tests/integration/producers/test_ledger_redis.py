"""The Redis effects ledger passes the shared contract, and falls back to the projected index.

``TestRedisLedger``: a sync client only (the async face falls back to the sync calls);
``TestAsyncRedisLedger``: with redis-py's asyncio client, which the async face awaits.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, cast

import pytest
import redis
import redis.asyncio

from runlog.producers.calls._ledger import LedgerEntry, RedisEffectLedger
from runlog.schemas import EffectStatus, Settings
from tests.unit.producers.faces import FACES, Face, OnLoop
from tests.unit.producers.ledger_contract import DK, LedgerContract, entry

pytestmark = pytest.mark.integration


class TestRedisLedger(LedgerContract):
    @pytest.fixture(autouse=True)
    def _ledger(self, settings: Settings, redis_client: redis.Redis) -> Iterator[None]:
        self.ledger = RedisEffectLedger(redis_client, settings.redis_prefix)
        yield


class TestAsyncRedisLedger(LedgerContract):
    @pytest.fixture(autouse=True)
    def _ledger(self, settings: Settings, redis_client: redis.Redis) -> Iterator[None]:
        self.aclient = redis.asyncio.Redis.from_url(settings.redis_url)
        self.ledger = RedisEffectLedger(redis_client, settings.redis_prefix, aclient=self.aclient)
        yield

    async def aclean(self) -> None:
        await self.aclient.aclose()


@pytest.fixture(params=FACES, ids=repr)
def face(request: pytest.FixtureRequest) -> Face:
    return cast(Face, request.param)


def _with_ledger(settings: Settings, redis_client: redis.Redis, face: Face,
                 case: Callable[[RedisEffectLedger], Coroutine[Any, Any, None]]) -> None:
    """Run ``case(ledger)`` on ``face``, the ledger with an asyncio client (closed on the case's loop)."""
    loop = OnLoop(settings.redis_url)
    ledger = RedisEffectLedger(redis_client, settings.redis_prefix, aclient=loop.aclient)
    face.run(lambda: case(ledger), loop.aclient.aclose)


def _project(redis_client: redis.Redis, ledger: RedisEffectLedger, run_id: str, status: str,
             external_id: str | None) -> None:
    redis_client.hset(ledger.index_key, DK, json.dumps(
        {"delivery_key": DK, "run_id": run_id, "status": status, "external_id": external_id,
         "call_id": "s/t/0", "target": "x", "seq": 9, "updated_at": 1}))


def test_a_key_only_the_projection_knows_is_answered_from_it(
        settings: Settings, redis_client: redis.Redis, face: Face) -> None:
    async def case(ledger: RedisEffectLedger) -> None:
        _project(redis_client, ledger, "run-old", "DONE", "ext-old")
        other = await face.open(ledger, entry("run-new"))
        assert other is not None and other.done and other.source == "projection"
        assert other.external_id == "ext-old"
        assert redis_client.get(ledger.claim_key(DK)) is None  # nothing claimed on its behalf
        found = ledger.lookup(DK)
        assert found is not None and found.status is EffectStatus.DONE

    _with_ledger(settings, redis_client, face, case)


def test_a_done_effect_only_the_projection_knows_is_done_for_its_own_run_too(
        settings: Settings, redis_client: redis.Redis, face: Face) -> None:
    """Claims lost with Redis, the projection rebuilt from the log: done still beats open, for
    the run that did it as well (the same call on a resume, or another call of that run)."""
    async def case(ledger: RedisEffectLedger) -> None:
        _project(redis_client, ledger, "run-a", "DONE", "ext-a")
        for asker in (entry("run-a"), entry("run-a", "s/t/9"), entry("run-b")):
            other = await face.open(ledger, asker)
            assert other is not None and other.done and other.external_id == "ext-a", asker
        assert redis_client.get(ledger.claim_key(DK)) is None

    _with_ledger(settings, redis_client, face, case)


def test_an_open_or_failed_effect_only_the_projection_knows(
        settings: Settings, redis_client: redis.Redis, face: Face) -> None:
    """The projected entry follows the claims' rule: the same call takes it back, a failed one is free."""
    async def case(ledger: RedisEffectLedger) -> None:
        _project(redis_client, ledger, "run-a", "INTENT", None)
        other = await face.open(ledger, entry("run-b"))
        assert other is not None and not other.done and other.source == "projection"
        assert await face.open(ledger, entry("run-a")) is None  # the holder's own call (a resume)
        redis_client.delete(ledger.claim_key(DK))
        _project(redis_client, ledger, "run-a", "FAILED", None)
        assert await face.open(ledger, entry("run-b")) is None
        got = ledger.lookup(DK)
        assert got is not None and got.run_id == "run-b" and got.source == "claim"

    _with_ledger(settings, redis_client, face, case)


def test_the_async_face_makes_no_sync_round_trip(settings: Settings, redis_client: redis.Redis) -> None:
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)  # any sync call fails
    loop = OnLoop(settings.redis_url)
    ledger = RedisEffectLedger(dead, settings.redis_prefix, aclient=loop.aclient)

    async def case() -> None:
        _project(redis_client, ledger, "run-old", "DONE", "ext-old")
        found = await ledger.aopen(LedgerEntry("e" * 64, "run-a", "s/t/0", EffectStatus.INTENT))
        assert found is None
        await ledger.aclose_effect("e" * 64, "run-a", "s/t/0", EffectStatus.DONE, "ext-1")
        old = await ledger.aopen(entry("run-new"))
        assert old is not None and old.source == "projection"

    loop.run(case)
    raw = redis_client.get(ledger.claim_key("e" * 64))
    assert raw is not None and LedgerEntry.from_json("e" * 64, raw).external_id == "ext-1"


def test_claims_live_in_the_delivery_keys_slot(settings: Settings, redis_client: redis.Redis) -> None:
    ledger = RedisEffectLedger(redis_client, settings.redis_prefix)
    assert ledger.claim_key(DK) == f"{settings.redis_prefix}:{{{DK}}}:effect"


# -- Redis lost its claims and projection: the compacted effects topic answers (issue 24, item 5) ----


def _entry(dk: str, run: str, call: str) -> LedgerEntry:
    return LedgerEntry(dk, run, call, EffectStatus.INTENT, None, None, "charge")


def _publish_effect(settings: Settings, dk: str, run_id: str, status: EffectStatus,
                    external_id: str | None) -> None:
    """One effects-topic record, as the projector publishes it (key: the delivery key)."""
    from confluent_kafka import Producer

    from runlog.schemas import Codec, Topics
    from runlog.schemas._types import Effect

    p = Producer(settings.producer_config())
    eff = Effect(dk, run_id, "cards:charges", status, 3, 1_700_000_000_000, external_id, "charge", "pay")
    p.produce(Topics.of(settings).effects, key=dk.encode(), value=Codec.from_settings(settings).encode(eff))
    assert p.flush(30) == 0


def test_a_key_redis_lost_is_found_done_in_the_effects_topic(topics: Settings,
                                                             redis_client: redis.Redis) -> None:
    from runlog.producers.calls._ledger_topic import EffectsTopic
    from runlog.projections._marker import marker_key

    dk = "e" * 64
    _publish_effect(topics, dk, "run-a", EffectStatus.DONE, "ch-1")
    _publish_effect(topics, "f" * 64, "run-a", EffectStatus.INTENT, None)
    topic = EffectsTopic(topics)
    try:
        ledger = RedisEffectLedger(redis_client, topics.redis_prefix, effects_topic=topic)
        # no claim, no projection, no marker (Redis lost everything): the topic says done in run-a
        found = ledger.open(_entry(dk, "run-b", "c1"))
        assert found is not None and found.done and found.run_id == "run-a" and found.external_id == "ch-1"
        assert found.source == "effects_topic"
        assert redis_client.get(ledger.claim_key(dk)) is None  # nothing claimed
        # open in run-a per the topic: in doubt for another run, the run's own for run-a (a resume)
        other = ledger.open(_entry("f" * 64, "run-b", "c1"))
        assert other is not None and other.status is EffectStatus.INTENT and other.run_id == "run-a"
        assert ledger.open(_entry("f" * 64, "run-a", "c9")) is None
        # a key the topic does not hold is claimed as before; the topic's partition was read once
        read = topic.records_read
        assert ledger.open(_entry("a" * 64, "run-b", "c2")) is None
        assert topic.records_read - read <= 2
        # a ready projection is whole: a key it lacks is unknown, the topic is not asked
        redis_client.hset(marker_key(topics.redis_prefix), mapping={"gen": "g1", "state": "ready"})
        read = topic.records_read
        assert ledger.open(_entry("b" * 64, "run-b", "c3")) is None
        assert topic.records_read == read
    finally:
        topic.close()


def test_without_the_topic_the_same_loss_lets_a_second_run_claim_a_done_effect(
        topics: Settings, redis_client: redis.Redis) -> None:
    """The control: Redis alone cannot tell, and hands the key to the second run."""
    dk = "e" * 64
    _publish_effect(topics, dk, "run-a", EffectStatus.DONE, "ch-1")
    assert RedisEffectLedger(redis_client, topics.redis_prefix).open(_entry(dk, "run-b", "c1")) is None


def test_the_async_face_asks_the_effects_topic_off_the_event_loop(topics: Settings,
                                                                  redis_client: redis.Redis) -> None:
    """The topic is a blocking Kafka read: on the async face it runs on a worker thread, and the other
    runs on the loop go on meanwhile (a ticker keeps ticking through a slow lookup)."""
    import asyncio
    import threading
    import time

    from runlog.producers.calls._ledger_topic import EffectsTopic

    dk = "e" * 64
    _publish_effect(topics, dk, "run-a", EffectStatus.DONE, "ch-1")
    topic = EffectsTopic(topics)
    looked_up_on: list[threading.Thread] = []

    def slow(key: str) -> LedgerEntry | None:
        looked_up_on.append(threading.current_thread())
        time.sleep(0.3)
        return topic(key)

    loop = OnLoop(topics.redis_url)
    ledger = RedisEffectLedger(redis_client, topics.redis_prefix, aclient=loop.aclient, effects_topic=slow)
    ticks = 0

    async def case() -> None:
        nonlocal ticks
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        t = asyncio.create_task(ticker())
        found = await ledger.aopen(_entry(dk, "run-b", "c1"))
        stop.set()
        await t
        assert found is not None and found.done and found.source == "effects_topic"
        assert looked_up_on and looked_up_on[0] is not threading.current_thread()

    try:
        loop.run(case)
    finally:
        topic.close()
    assert ticks >= 10, ticks  # 0.3 s of lookup: the loop ran the ticker throughout (1 tick if blocked)
