"""The fleet acceptance's App (:mod:`tests.integration.fleet.acceptance`), importable by ``runlog worker``:
an agent whose one model call goes through a limit shared by the fleet and whose last stage applies
an effect at the fake provider (:mod:`tests.integration.fake_provider`).

The limit's period comes from ``ACCEPT_PER_S`` (60: the provider's one-minute limits; 10: the CI
variant's time scaling), its size a little under the provider's 600 requests and 100,000 tokens, so
a grant and the provider's own clock never disagree at the margin."""

from __future__ import annotations

import os
from typing import Any

from runlog.processors.resume import App
from runlog.producers import (
    CallInfo,
    DictInputSource,
    Queue,
    RateLimit,
    ReplayPolicy,
    RetryPolicy,
    Workflow,
    tool,
)
from runlog.schemas import Usage
from tests.integration.fake_provider import ask, effect

PER_S = float(os.environ.get("ACCEPT_PER_S", "60"))
SHARE = 0.95
"""The limit's share of the provider's."""
PROVIDER_REQUESTS, PROVIDER_TOKENS = 600, 100_000
MODEL = RateLimit("fake:model", requests=int(PROVIDER_REQUESTS * SHARE), tokens=int(PROVIDER_TOKENS * SHARE),
                  per_s=PER_S)
ESTIMATE = 500
"""Tokens a call is expected to spend (the runs spend 400 to 600: the usage settles the difference)."""


@tool("complete", policy=ReplayPolicy.SAFE, limit=MODEL, estimate=lambda args: ESTIMATE,
      usage=lambda r: Usage("fake:model", r["usage"]["input_tokens"], r["usage"]["output_tokens"]),
      retry=RetryPolicy(attempts=5, backoff=0.5))
def complete(call: CallInfo, base: str, tokens: int, tenant: str) -> Any:
    return ask(f"{base}/v1/complete", tokens, tenant, call.run_id)


@tool("deliver", policy=ReplayPolicy.IDEMPOTENT, effect=True, target="provider:effects",
      delivery=lambda args, call: ("acceptance", "provider", call.run_id, "1"))
def deliver(call: CallInfo, base: str, tenant: str) -> Any:
    assert call.idempotency_key is not None
    return effect(base, call.idempotency_key, tenant, call.run_id)


def agent() -> Workflow:
    wf = Workflow("agent", "1")

    @wf.stage("think")
    def think(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        p = ctx.params
        out = ctx.call(complete, base=p["base"], tokens=int(p["tokens"]), tenant=p["tenant"])
        return {"text": out["text"], "tokens": out["usage"]["input_tokens"] + out["usage"]["output_tokens"]}

    @wf.stage("deliver")
    def send(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        p = ctx.params
        return {"external_id": ctx.call(deliver, base=p["base"], tenant=p["tenant"])["external_id"]}

    return wf


AGENTS = Queue("agents", concurrency=16, weights={"t3": 2})
app = App.of([agent()], [complete, deliver], DictInputSource({}), name="fleet-acceptance", queues=[AGENTS])
