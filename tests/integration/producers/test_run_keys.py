"""Run idempotency keys: the run id is the key's, claims move pending -> started, old claims read started;
the async face (aclaim / amark_started) does the same on the asyncio client."""

from __future__ import annotations

import asyncio
import json

import pytest
import redis
import redis.asyncio

from producers._runs import Claim, RunKeys, run_id_for_key
from schemas import RunConflict, Settings
from tests.unit.producers.faces import OnLoop

pytestmark = pytest.mark.integration


def test_the_run_id_is_a_pure_function_of_the_key() -> None:
    assert run_id_for_key("order-1") == run_id_for_key("order-1")
    assert run_id_for_key("order-1") != run_id_for_key("order-2")
    assert run_id_for_key("a").startswith("run-") and len(run_id_for_key("a")) == 36


def test_a_claim_is_pending_until_marked_started(settings: Settings, redis_client: redis.Redis) -> None:
    keys = RunKeys(redis_client, settings.redis_prefix)
    rid = run_id_for_key("k")
    first = keys.claim("k", rid, "p", "wf@1")
    assert (first.run_id, first.created, first.started) == (rid, True, False)
    again = keys.claim("k", rid, "p", "wf@1")
    assert (again.created, again.started) == (False, False)
    keys.mark_started("k", rid, "p", "wf@1")
    assert keys.claim("k", rid, "p", "wf@1").started
    with pytest.raises(RunConflict):
        keys.claim("k", rid, "other-params", "wf@1")


def test_a_claim_written_before_states_existed_reads_started(
        settings: Settings, redis_client: redis.Redis) -> None:
    keys = RunKeys(redis_client, settings.redis_prefix)
    redis_client.set(keys.key("old"), json.dumps({"run_id": "run-legacy", "params_hash": "p",
                                                  "workflow": "wf@1"}))
    c = keys.claim("old", run_id_for_key("old"), "p", "wf@1")
    assert (c.run_id, c.created, c.started) == ("run-legacy", False, True)


def test_the_async_face_claims_and_marks_on_the_asyncio_client(
        settings: Settings, redis_client: redis.Redis) -> None:
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)  # any sync call fails
    sync = RunKeys(redis_client, settings.redis_prefix)
    rid = run_id_for_key("k")
    loop = OnLoop(settings.redis_url)
    keys = RunKeys(dead, settings.redis_prefix, aclient=loop.aclient)

    async def case() -> None:
        first = await keys.aclaim("k", rid, "p", "wf@1")
        assert (first.run_id, first.created, first.started) == (rid, True, False)
        assert sync.claim("k", rid, "p", "wf@1") == Claim(rid, False, False)  # one claim, both faces
        again = await keys.aclaim("k", rid, "p", "wf@1")
        assert (again.created, again.started) == (False, False)
        await keys.amark_started("k", rid, "p", "wf@1")
        assert (await keys.aclaim("k", rid, "p", "wf@1")).started
        assert sync.claim("k", rid, "p", "wf@1").started
        with pytest.raises(RunConflict):
            await keys.aclaim("k", rid, "other-params", "wf@1")
        with pytest.raises(RunConflict):
            await keys.aclaim("k", rid, "p", "wf@2")
        redis_client.set(keys.key("old"), json.dumps({"run_id": "run-legacy", "params_hash": "p",
                                                      "workflow": "wf@1"}))
        old = await keys.aclaim("old", run_id_for_key("old"), "p", "wf@1")
        assert (old.run_id, old.created, old.started) == ("run-legacy", False, True)

    loop.run(case)


def test_without_an_asyncio_client_the_async_face_is_the_sync_one(
        settings: Settings, redis_client: redis.Redis) -> None:
    keys = RunKeys(redis_client, settings.redis_prefix)
    rid = run_id_for_key("k")

    async def main() -> None:
        assert (await keys.aclaim("k", rid, "p", "wf@1")).created
        await keys.amark_started("k", rid, "p", "wf@1")

    asyncio.run(main())
    assert keys.claim("k", rid, "p", "wf@1") == Claim(rid, False, True)
