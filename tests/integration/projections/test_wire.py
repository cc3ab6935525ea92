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


@pytest.mark.parametrize("retries", [0, 1])
def test_a_connection_dropped_after_it_was_taken_follows_the_clients_retry_policy(
        settings: Settings, monkeypatch: pytest.MonkeyPatch, retries: int) -> None:
    """The pool hands out a connection it checked; the server drops it right after: the send or the
    read fails and the connection is dropped. Under the client's retry policy the whole pipeline is
    sent again on a new connection (Runlog's own clients retry 0 times: the caller's failover
    window waits instead, and the error reaches it)."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from runlog.projections import _wire

    client = redis.Redis.from_url(settings.redis_url, retry=Retry(NoBackoff(), retries))
    other = redis_client_of(settings)
    key = f"{settings.redis_prefix}:wire-drop-{retries}"
    assert pipeline(client, [("DEL", key), ("INCR", key)]) == [0, 1]
    pool = client.connection_pool
    take = pool.get_connection
    drops: list[Exception] = []
    dropper = _wire._dropper

    def taken_then_killed(*a: object, **k: object) -> object:
        conn = take(*a, **k)
        conn.send_command("CLIENT", "ID")
        assert other.client_kill_filter(_id=conn.read_response()) == 1
        return conn

    def counting(conn: object) -> object:
        fail = dropper(conn)

        def count(err: Exception) -> None:
            drops.append(err)
            fail(err)

        return count

    monkeypatch.setattr(pool, "get_connection", taken_then_killed)
    monkeypatch.setattr(_wire, "_dropper", counting)
    try:
        if retries:
            assert pipeline(client, [("INCR", key), ("GET", key)]) == [2, b"2"]
            assert len(drops) == 1 and isinstance(drops[0], redis.ConnectionError), drops
        else:
            with pytest.raises(redis.ConnectionError):
                pipeline(client, [("INCR", key), ("GET", key)])
        monkeypatch.setattr(pool, "get_connection", take)
        assert client.ping()  # the dropped connection was not handed on
    finally:
        other.close()
        client.close()


def test_a_value_hiredis_cannot_pack_is_a_data_error(redis_client: redis.Redis) -> None:
    with pytest.raises(redis.DataError):
        pipeline(redis_client, [("SET", "k", None)])  # type: ignore[list-item]
