"""Rate limits in the real Redis: the Redis limiter keeps the limiter contract, and three runners (as
three processes would, each with its own clients) calling one model provider through a shared
limit never make it answer 429, while a provider that is asked without the limit does."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

from runlog.producers import (
    CallInfo,
    RateLimit,
    ReplayPolicy,
    RetryPolicy,
    Runner,
    Workflow,
    tool,
)
from runlog.producers.internal import Limiter, RedisLimiter
from runlog.schemas import Settings, Usage
from tests.integration.fake_provider import Provider, ask
from tests.integration.producers.conftest import SOURCE
from tests.unit.producers.limiter_contract import LimiterContract

pytestmark = pytest.mark.integration


class TestRedisLimiter(LimiterContract):
    @pytest.fixture(autouse=True)
    def _redis(self, settings: Settings, redis_client: redis.Redis) -> None:
        self.settings, self.client = settings, redis_client

    def limiter(self) -> Limiter:
        return RedisLimiter(self.client, self.settings.redis_prefix)


@pytest.fixture
def provider() -> Iterator[Provider]:
    p = Provider(requests=8, tokens=1200, per_s=2.0)
    yield p
    p.close()


def _workflow(url: str, limit: RateLimit | None) -> Workflow:
    @tool("complete", policy=ReplayPolicy.SAFE, limit=limit, estimate=(lambda a: 150) if limit else None,
          usage=lambda r: Usage("fake:model", r["usage"]["input_tokens"], r["usage"]["output_tokens"]),
          retry=RetryPolicy(attempts=1))
    def complete(call: CallInfo, n: int) -> Any:
        return ask(url, 150)

    wf = Workflow("chat", "1")

    @wf.stage("talk")
    def talk(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"said": [ctx.call(complete, n=i)["text"] for i in range(3)]}

    return wf


def _fleet(settings: Settings, wf: Workflow, runs: int) -> list[Any]:
    runners = [Runner.from_settings(settings, source=SOURCE) for _ in range(3)]  # three "processes"
    try:
        with ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(runners[i % 3].run, wf, {"i": i}) for i in range(runs)]
            return [f.exception() or f.result() for f in futures]
    finally:
        for r in runners:
            r.close()


def test_runners_sharing_a_limit_never_exceed_the_provider(topics: Settings, provider: Provider) -> None:
    # a little below the provider's own (8 requests, 1,200 tokens per 2 s): a grant and the provider's
    # clock disagree by the request's way there, so a limit at 100% could be refused at the margin
    limit = RateLimit("fake:model", requests=7, tokens=1100, per_s=2.0)
    t0 = time.monotonic()
    results = _fleet(topics, _workflow(provider.url, limit), runs=8)  # 24 calls, 3,600 tokens
    took = time.monotonic() - t0
    assert all(not isinstance(r, BaseException) and r.completed for r in results), results
    assert (provider.served, provider.refused) == (24, 0)
    # 3.5 requests a second after a burst of 7: 24 calls take about 5 s; the limit was used, not
    # undercut by a wide margin
    assert took < 15, took


def test_without_the_limit_the_same_fleet_is_refused(topics: Settings, provider: Provider) -> None:
    results = _fleet(topics, _workflow(provider.url, None), runs=8)
    assert provider.refused > 0  # the comparison shows the limit is what kept the 429s away
    assert any(isinstance(r, BaseException) for r in results)
