"""The crash matrix's shop (tests/integration/resume/_shop_world.py) as a durable Pydantic AI agent:
workflow ``agent-shop``, whose model is a Pydantic AI ``FunctionModel`` following the world's
script, its conversation passed from stage to stage with ``dump_messages`` / ``load_messages``.

Run as a worker: ``python -m tests.integration.resume._pydantic_ai_agent --dir D [--order o-1]
[--sdk sync|async]``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

from runlog.processors.resume import App
from runlog.producers import AsyncStageContext, DictInputSource, Workflow, rule, tool
from runlog.producers.pydantic_ai import RunlogAgent, current_call, dump_messages, load_messages
from runlog.schemas import ReplayPolicy
from tests.integration.resume._shop_world import INSTRUCTIONS, PRICE, Shop, ShopWorld, delivery

MODEL_TOOL = "pydantic_ai.model.shop"
LOOKUP_TOOL = "pydantic_ai.tool.shop.lookup"
SAVE_TOOL = "orders.save_row"
MODEL_LABEL = "function:shop"
"""How the model's requests name it in their usage (``"<system>:<model_name>"``)."""


def _model(world: ShopWorld) -> FunctionModel:
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        prompts = [str(p.content) for m in messages for p in m.parts if isinstance(p, UserPromptPart)]
        returns = {p.tool_name: p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)}
        answer = world.respond(turn, prompts[-1], returns)
        input_tokens, output_tokens = world.tokens(turn)
        usage = RequestUsage(input_tokens=input_tokens, output_tokens=output_tokens)
        part = TextPart(answer) if isinstance(answer, str) else ToolCallPart(*answer)
        return ModelResponse(parts=[part], usage=usage)

    return FunctionModel(respond, model_name="shop")


def agent_app(root: Path, *, instructions: str = INSTRUCTIONS) -> App:
    """The application (workflow, tools, inputs, prices) on the world under ``root``."""
    world = ShopWorld(root)
    agent = Agent(_model(world), name="shop", instructions=instructions)
    agent.tool_plain(world.lookup)

    @agent.tool_plain
    async def save_order(order: str, price: int) -> dict[str, Any]:
        return world.save_order(current_call(), order, price)

    save = tool(SAVE_TOOL, policy=ReplayPolicy.RECONCILE_FIRST, target="sqlite:orders", delivery=delivery,
                reconcile=world.find_row)(save_order)
    durable = RunlogAgent(agent, tools={"save_order": save})

    wf = Workflow("agent-shop", version="1")

    @wf.stage("research", rules=[rule("priced", lambda out: out["answer"].startswith("the price is"))])
    async def research(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        result = await durable.run(ctx, f"look up {ctx.params['sku']}")
        return {"answer": result.output, "messages": dump_messages(result.all_messages())}

    @wf.stage("order", rules=[rule("saved", lambda out: out["answer"].startswith("saved row-"))])
    async def order(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        history = load_messages(ctx.output_of("research")["messages"])
        result = await durable.run(ctx, f"now save order {ctx.params['order']}", message_history=history)
        return {"answer": result.output}

    return App.of([wf], durable.tools(), DictInputSource({}), name="agent-shop",
                  prices={MODEL_LABEL: PRICE})


SHOP = Shop("pydantic_ai", "agent-shop",
            "tests.integration.resume._pydantic_ai_agent", MODEL_TOOL, LOOKUP_TOOL, SAVE_TOOL, agent_app)

if __name__ == "__main__":
    sys.exit(SHOP.main())
