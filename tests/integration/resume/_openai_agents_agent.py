"""The crash matrix's shop (tests/integration/resume/_shop_world.py) as a durable OpenAI Agents SDK
agent: workflow ``oa-shop``, whose model implements the SDK's ``Model`` interface and answers the
world's script with ``ModelResponse``s built from the SDK's ``agents.testing`` items, its items
passed from stage to stage (``result.to_input_list()``).

Run as a worker: ``python -m tests.integration.resume._openai_agents_agent --dir D [--order o-1]
[--sdk sync|async]``.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agents import Agent, ModelResponse, RunConfig, function_tool
from agents.items import TResponseStreamEvent
from agents.models.interface import Model, ModelProvider
from agents.testing import assistant_message, function_call
from agents.usage import Usage as AgentsUsage

from runlog.processors.resume import App
from runlog.producers import AsyncStageContext, DictInputSource, Workflow, rule, tool
from runlog.producers.openai_agents import RunlogAgent, current_call
from runlog.schemas import ReplayPolicy
from tests.integration.resume._shop_world import INSTRUCTIONS, PRICE, Shop, ShopWorld, delivery

MODEL_NAME = "gpt-shop"
MODEL_TOOL = "openai_agents.model.shop"
LOOKUP_TOOL = "openai_agents.tool.shop.lookup"
SAVE_TOOL = "orders.oa_save_row"
OTHER_MODEL = "other-shop-model"
"""A model name the run config's provider knows (a replay's ``--model``): it answers without a tool."""


class _Other(Model):
    """The model a replay names instead of the agent's own: one plain answer, no tool."""

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        return ModelResponse(output=[assistant_message("another model's answer")],
                             usage=AgentsUsage(requests=1, input_tokens=5, output_tokens=3, total_tokens=8),
                             response_id="resp-other")

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("not streamed")
        yield  # pragma: no cover


class _Provider(ModelProvider):
    def get_model(self, model_name: str | None) -> Model:
        if model_name != OTHER_MODEL:
            raise ValueError(f"no model {model_name!r} here (no network in tests)")
        return _Other()


CONFIG = RunConfig(tracing_disabled=True, model_provider=_Provider())


def _get(item: Any, key: str) -> Any:
    return item.get(key) if isinstance(item, dict) else getattr(item, key, None)


class _ShopModel(Model):
    """The world's script as the SDK's ``Model`` (a tool call's id is ``call-<tool>``)."""

    def __init__(self, world: ShopWorld) -> None:
        self.world = world

    async def get_response(self, system_instructions: str | None, input: Any, model_settings: Any,
                           tools: Any, output_schema: Any, handoffs: Any, tracing: Any, *,
                           previous_response_id: str | None, conversation_id: str | None,
                           prompt: Any) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        turn = sum(_get(i, "type") == "function_call" or _get(i, "role") == "assistant" for i in items)
        prompts = [str(_get(i, "content")) for i in items if _get(i, "role") == "user"]
        returns = {str(_get(i, "call_id")).removeprefix("call-"): ast.literal_eval(_get(i, "output"))
                   for i in items if _get(i, "type") == "function_call_output"}
        answer = self.world.respond(turn, prompts[-1], returns)
        input_tokens, output_tokens = self.world.tokens(turn)
        usage = AgentsUsage(requests=1, input_tokens=input_tokens, output_tokens=output_tokens,
                            total_tokens=input_tokens + output_tokens)
        out = [assistant_message(answer) if isinstance(answer, str)
               else function_call(answer[0], answer[1], call_id=f"call-{answer[0]}")]
        return ModelResponse(output=out, usage=usage, response_id=f"resp-{turn}")

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("not streamed")
        yield  # pragma: no cover


def agent_app(root: Path, *, instructions: str = INSTRUCTIONS) -> App:
    """The application (workflow, tools, inputs, prices) on the world under ``root``."""
    world = ShopWorld(root)

    @function_tool
    def lookup(sku: str) -> dict[str, Any]:
        """Look a price up."""
        return world.lookup(sku)

    @function_tool(failure_error_function=None)
    async def save_order(order: str, price: int) -> dict[str, Any]:
        """Save an order."""
        return world.save_order(current_call(), order, price)

    agent = Agent(name="shop", instructions=instructions, model=_ShopModel(world), tools=[lookup, save_order])
    save = tool(SAVE_TOOL, policy=ReplayPolicy.RECONCILE_FIRST, target="sqlite:orders", delivery=delivery,
                reconcile=world.find_row)(_not_called)
    durable = RunlogAgent(agent, model_name=MODEL_NAME, tools={"save_order": save})

    wf = Workflow("oa-shop", version="1")

    @wf.stage("research", rules=[rule("priced", lambda out: out["answer"].startswith("the price is"))])
    async def research(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        result = await durable.run(ctx, f"look up {ctx.params['sku']}", run_config=CONFIG)
        return {"answer": result.final_output, "items": result.to_input_list()}

    @wf.stage("order", rules=[rule("saved", lambda out: out["answer"].startswith("saved row-"))])
    async def order(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        items = [*ctx.output_of("research")["items"],
                 {"role": "user", "content": f"now save order {ctx.params['order']}"}]
        result = await durable.run(ctx, items, run_config=CONFIG)
        return {"answer": result.final_output}

    return App.of([wf], durable.tools(), DictInputSource({}), name="oa-shop", prices={MODEL_NAME: PRICE})


def _not_called(call: Any, **args: Any) -> Any:
    raise AssertionError("the mapped tool's fn is not called: the function tool runs in its call")


SHOP = Shop("openai_agents", "oa-shop",
            "tests.integration.resume._openai_agents_agent", MODEL_TOOL, LOOKUP_TOOL, SAVE_TOOL, agent_app)

if __name__ == "__main__":
    sys.exit(SHOP.main())
