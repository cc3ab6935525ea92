"""projections._wire: the projector's hiredis-packed pipeline against real Redis, beside redis-py's own."""

from __future__ import annotations

import pytest
import redis

from runlog.projections._wire import packs_fast, pipeline
from runlog.schemas import Settings
from runlog.schemas.internal import redis_client as redis_client_of

pytestmark = pytest.mark.integration


def _commands(key: str) -> list[tuple[str | int | bytes, ...]]:
    return [
        ("DEL", key),
        ("HSET", key, "n", 7, "s", "text é", "b", b"\x00\xff"),
        ("HINCRBY", key, "n", 5),
        ("EVALSHA", "0" * 40, 0),  # no such script: the error in its place, the rest still answered
        ("HMGET", key, "n", "s", "b"),
        ("HINCRBY", key, "s", 1),  # not an integer: an error reply in its place
    ]


def _check(out: list[object]) -> None:
    assert out[:3] == [0, 3, 12]
    assert isinstance(out[3], redis.exceptions.NoScriptError)
    assert out[4] == [b"12", "text é".encode(), b"\x00\xff"]
    assert isinstance(out[5], redis.ResponseError)


def test_replies_in_order_with_error_replies_in_place(settings: Settings, redis_client: redis.Redis) -> None:
    assert packs_fast(redis_client)
    key = f"{settings.redis_prefix}:wire"
    _check(pipeline(redis_client, _commands(key)))
    assert redis_client.ping()  # the connection went back to the pool usable: nothing left unread


def test_redis_py_pipeline_answers_the_same(settings: Settings, redis_client: redis.Redis) -> None:
    single = redis.Redis(connection_pool=redis_client.connection_pool, single_connection_client=True)
    try:
        assert not packs_fast(single)  # a client holding one connection goes through redis-py's pipeline
        _check(pipeline(single, _commands(f"{settings.redis_prefix}:wire-py")))
    finally:
        single.close()


def test_a_connection_the_server_closed_is_replaced(settings: Settings, redis_client: redis.Redis) -> None:
    key = f"{settings.redis_prefix}:wire-kill"
    assert pipeline(redis_client, [("DEL", key), ("INCR", key)]) == [0, 1]
    pooled = redis_client.connection_pool.get_connection()
    pooled.send_command("CLIENT", "ID")
    cid = pooled.read_response()
    redis_client.connection_pool.release(pooled)
    other = redis_client_of(settings)  # not the pool's connection: CLIENT KILL skips itself
    try:
        assert other.client_kill_filter(_id=cid) == 1
    finally:
        other.close()
    # the pooled connection is dead: dropped, connected again, the commands sent once more
    assert pipeline(redis_client, [("INCR", key), ("GET", key)]) == [2, b"2"]
