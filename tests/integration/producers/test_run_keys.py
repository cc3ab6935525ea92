"""Run idempotency keys: the run id is the key's, claims move pending -> started, old claims read started;
the async face (aclaim / amark_started) does the same on the asyncio client."""

from __future__ import annotations

import asyncio
import json

import pytest
import redis
import redis.asyncio

from runlog.producers.run._runs import Claim, RunKeys, run_id_for_key
from runlog.schemas import RunConflict, Settings
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


# -- Redis lost its data: a retried keyed start must not start the run again ------------------


def _lose_redis(settings: Settings, client: redis.Redis) -> None:
    """What a Redis restart without persistence leaves of this namespace: nothing."""
    for k in list(client.scan_iter(match=f"{settings.redis_prefix}:*", count=1000)):
        client.delete(k)


def test_known_reads_the_projection(settings: Settings, redis_client: redis.Redis) -> None:
    keys = RunKeys(redis_client, settings.redis_prefix)
    p = settings.redis_prefix
    assert keys.known("run-a") is None  # no namespace: only the log can tell
    redis_client.hset(f"{p}:projection", mapping={"gen": "g1", "state": "rebuilding"})
    assert keys.known("run-a") is None  # a rebuild is under way
    redis_client.hset(f"{p}:projection", "state", "ready")
    assert keys.known("run-a") is False
    redis_client.hset(f"{p}:{{run-a}}:state", "status", "COMPLETED")
    assert keys.known("run-a") is True
    loop = OnLoop(settings.redis_url)
    async_keys = RunKeys(redis_client, p, aclient=loop.aclient)
    seen: list[bool | None] = []

    async def case() -> None:
        seen.extend([await async_keys.aknown("run-a"), await async_keys.aknown("run-b")])

    loop.run(case)
    assert seen == [True, False]


def test_a_keyed_retry_after_redis_lost_its_data_finds_the_run_on_the_log(topics: Settings) -> None:
    from runlog.producers import ReplayPolicy, Runner, StageContext, Workflow, tool
    from tests.integration.producers.helpers import events_of, read_events

    calls: list[int] = []

    @tool("charge", policy=ReplayPolicy.IDEMPOTENT, effect=True, target="cards:charges",
          delivery=lambda a, c: ("acct-loss", "cards", str(a["n"]), "1"))
    def charge(call: object, n: int) -> dict[str, object]:
        calls.append(n)
        return {"charged": n, "external_id": f"ch-{n}"}

    wf = Workflow("keyed-loss", "1")

    @wf.stage("pay")
    def pay(ctx: StageContext, inputs: dict[str, object]) -> dict[str, object]:
        return ctx.call(charge, n=ctx.params["n"])

    with Runner.from_settings(topics) as r:
        first = r.run(wf, {"n": 7}, idempotency_key="order-7")
    assert first.completed and calls == [7]
    before = len(events_of(read_events(topics), first.run_id))

    client = redis.Redis.from_url(topics.redis_url, **topics.redis_kwargs())
    try:
        _lose_redis(topics, client)
        with Runner.from_settings(topics) as r:
            again = r.start_run(wf, {"n": 7}, idempotency_key="order-7")
        assert (again.run_id, again.created, again.session) == (first.run_id, False, None)
        assert calls == [7]  # the effect was not made a second time
        assert len(events_of(read_events(topics), first.run_id)) == before  # no second RUN_STARTED
        settled = RunKeys(client, topics.redis_prefix).claim(
            "order-7", first.run_id, again.params_hash, "keyed-loss@1")
        assert (settled.created, settled.started) == (False, True)  # the key is settled for good
    finally:
        client.close()
