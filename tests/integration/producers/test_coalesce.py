"""Coalesced pipelines against real Redis: the fills many runs ask for in one loop pass share one
round trip, each caller gets the answers of its own commands, and a command that fails fails only
its own caller; on the sync client the same step is a plain pipeline."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import redis
import redis.asyncio

from producers.run._coalesce import coalesced
from producers.run._redis_io import arun, one, run
from schemas import Settings

pytestmark = pytest.mark.integration


def test_fills_of_one_loop_pass_share_one_round_trip_and_each_gets_its_own_answers(
        settings: Settings, redis_client: redis.Redis) -> None:
    base = f"t-coalesce-{uuid.uuid4().hex[:8]}"
    redis_client.set(f"{base}:string", "x")  # an HSET on it fails with WRONGTYPE
    sent: list[int] = []

    async def case() -> list[Any]:
        aclient = redis.asyncio.Redis.from_url(settings.redis_url)
        real = aclient.pipeline

        def counted(*args: Any, **kwargs: Any) -> Any:
            sent.append(1)
            return real(*args, **kwargs)

        aclient.pipeline = counted  # type: ignore[method-assign]

        def fill(i: int) -> Any:
            def f(pipe: Any) -> None:
                pipe.hset(f"{base}:h", str(i), str(i))
                pipe.hget(f"{base}:h", str(i))
            return f

        def bad(pipe: Any) -> None:
            pipe.hset(f"{base}:string", "k", "v")

        try:
            steps = [arun(one(coalesced(fill(i))), aclient, redis_client) for i in range(30)]
            return await asyncio.gather(*steps, arun(one(coalesced(bad)), aclient, redis_client),
                                        return_exceptions=True)
        finally:
            await aclient.aclose()

    answers = asyncio.run(case())
    assert sent == [1]  # 31 callers, one pipeline
    assert answers[:30] == [[1, str(i).encode()] for i in range(30)]
    assert isinstance(answers[30], redis.ResponseError) and "WRONGTYPE" in str(answers[30])
    assert redis_client.hlen(f"{base}:h") == 30
    # the sync face: a pipeline of its own, the same answers
    assert run(one(coalesced(lambda pipe: pipe.hget(f"{base}:h", "7"))), redis_client) == [b"7"]
    redis_client.delete(f"{base}:h", f"{base}:string")
