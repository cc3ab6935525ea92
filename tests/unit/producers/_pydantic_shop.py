"""A shop agent on Pydantic AI's ``FunctionModel`` for the unit tests of
:mod:`runlog.producers.pydantic_ai` (no network)."""

from __future__ import annotations

from dataclasses import dataclass, field
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

from runlog.producers import AsyncStageContext, ReplayPolicy, Workflow, rule, tool
from runlog.producers.pydantic_ai import RunlogAgent, current_call

MODEL = "pydantic_ai.model.shop"
LOOKUP = "pydantic_ai.tool.shop.lookup"
SAVE = "orders.save"
PROMPT = {"prompt": "order sku-1 as o-1"}


@dataclass
class Shop:
    """What the model and the tools really did, and how the model answers."""

    model_turns: list[int] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    final: str = "saved {id} for {price}"
    fail_at_turn: int | None = None

    def respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        """Look the price up, then (unless only asked to look) save the order, then answer."""
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        self.model_turns.append(turn)
        if turn == self.fail_at_turn:
            raise RuntimeError(f"the model is down at turn {turn}")
        prompts = [p.content for m in messages for p in m.parts if isinstance(p, UserPromptPart)]
        returns = {p.tool_name: p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)}
        if "lookup" not in returns:
            return ModelResponse(parts=[ToolCallPart("lookup", {"sku": "sku-1"})])
        price = returns["lookup"]["price"]
        if str(prompts[-1]).startswith("look"):
            return ModelResponse(parts=[TextPart(f"the price is {price}")])
        if "save" not in returns:
            return ModelResponse(parts=[ToolCallPart("save", {"order": "o-1", "price": price})])
        answer = self.final.format(id=returns["save"]["external_id"], price=price)
        return ModelResponse(parts=[TextPart(answer)])

    def agent(self, **kw: Any) -> RunlogAgent[None, str]:
        agent = Agent(FunctionModel(self.respond), name="shop")

        @agent.tool_plain
        def lookup(sku: str) -> dict[str, Any]:
            self.tools.append(f"lookup:{sku}")
            return {"sku": sku, "price": 1200}

        @agent.tool_plain
        async def save(order: str, price: int) -> dict[str, Any]:
            call = current_call()
            self.tools.append(f"save:{order}")
            assert call.delivery_key and call.idempotency_key
            self.rows.setdefault(call.delivery_key, {"order": order, "price": price})
            return {"external_id": f"row-{order}"}

        save_tool = tool(SAVE, policy=ReplayPolicy.IDEMPOTENT, effect=True, target="db:orders",
                         delivery=lambda args, call: ("acct", "db", args["order"], "1"))(save)
        return RunlogAgent(agent, tools={"save": save_tool}, **kw)


def one_stage(durable: RunlogAgent[None, str]) -> Workflow:
    wf = Workflow("shop", "1")

    @wf.stage("order", rules=[rule("answered", lambda out: out["answer"].startswith("saved"))])
    async def order(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        result = await durable.run(ctx, ctx.params["prompt"])
        return {"answer": result.output}

    return wf
