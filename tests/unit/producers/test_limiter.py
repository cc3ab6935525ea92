"""The in-memory limiter keeps the limiter contract; rate limits and their tools refuse bad
declarations; a tool's calls wait for their limit, a 429 blocks the key, and what a call waited is
on its TOOL_RESULT (in memory: runlog.testing)."""

from __future__ import annotations

from typing import Any

import pytest

from runlog.producers import CallInfo, RateLimit, RateLimited, ReplayPolicy, RetryPolicy, Workflow, tool
from runlog.producers.internal import InMemoryLimiter, Limiter
from runlog.schemas import EventType, Usage, WorkflowDefinitionError
from runlog.testing import InMemoryWorld
from tests.unit.producers.limiter_contract import LimiterContract


class TestInMemoryLimiter(LimiterContract):
    def limiter(self) -> Limiter:
        return InMemoryLimiter()


def test_a_limit_and_its_tool_refuse_what_cannot_be_counted() -> None:
    with pytest.raises(WorkflowDefinitionError, match="requests, tokens or both"):
        RateLimit("m")
    with pytest.raises(WorkflowDefinitionError, match="at least 1"):
        RateLimit("m", requests=0)
    with pytest.raises(WorkflowDefinitionError, match="needs limit="):
        tool("t", estimate=lambda args: 1)(lambda call: None)
    with pytest.raises(WorkflowDefinitionError, match="must be a RateLimit"):
        tool("t", limit="openai")(lambda call: None)  # type: ignore[arg-type]


LIMIT = RateLimit("provider:model", requests=2, tokens=1000, per_s=1.0)
CALLS: list[int] = []


@tool("ask", policy=ReplayPolicy.SAFE, limit=LIMIT, estimate=lambda args: int(args["tokens"]),
      usage=lambda r: Usage("provider:model", input_tokens=r["used"], output_tokens=0),
      retry=RetryPolicy(attempts=3))
def ask(call: CallInfo, n: int, tokens: int) -> Any:
    CALLS.append(n)
    if n == 99 and call.attempt == 1:
        raise RateLimited("429 Too Many Requests", retry_after_s=0.5)
    return {"n": n, "used": tokens}


def _wf() -> Workflow:
    wf = Workflow("limited", "1")

    @wf.stage("asks")
    def asks(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"answers": [ctx.call(ask, n=n, tokens=100)["n"] for n in ctx.params["ns"]]}

    return wf


def test_calls_beyond_the_limit_wait_and_say_so_on_their_result() -> None:
    CALLS.clear()
    world = InMemoryWorld()
    result = world.run(_wf(), {"ns": [1, 2, 3, 4]})
    assert result.outputs["asks"]["answers"] == [1, 2, 3, 4]
    waits = [int(e.attributes["limit_wait_ms"]) for e in world.events(result.run_id)
             if e.type is EventType.TOOL_RESULT]
    assert waits[:2] == [0, 0] and all(w >= 300 for w in waits[2:])  # two a second: the last two waited


def test_a_429_blocks_the_key_and_the_retry_waits_out_its_retry_after() -> None:
    CALLS.clear()
    world = InMemoryWorld()
    result = world.run(_wf(), {"ns": [99]})
    assert result.outputs["asks"]["answers"] == [99] and CALLS == [99, 99]
    (done,) = [e for e in world.events(result.run_id) if e.type is EventType.TOOL_RESULT]
    assert done.attributes["rate_limited"] == "1" and int(done.attributes["limit_wait_ms"]) >= 400
    assert done.attributes["attempts"] == "2"
