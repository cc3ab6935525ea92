"""A scripted OpenAI Agents SDK model and shop agent for the unit tests of
:mod:`runlog.producers.openai_agents` (no network: the model implements the SDK's ``Model`` interface and
answers with ``ModelResponse``s built from the SDK's ``agents.testing`` items)."""

from __future__ import annotations

import ast
import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from agents import Agent, ModelResponse, RunConfig, function_tool
from agents.items import TResponseOutputItem, TResponseStreamEvent
from agents.models.interface import Model
from agents.testing import assistant_message, function_call
from agents.usage import Usage as AgentsUsage
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

from runlog.producers import AsyncStageContext, ReplayPolicy, Workflow, rule, tool
from runlog.producers.openai_agents import RunlogAgent, current_call

MODEL = "openai_agents.model.shop"
LOOKUP = "openai_agents.tool.shop.lookup"
SAVE = "orders.save"
CONFIG = RunConfig(tracing_disabled=True)
PROMPT = {"prompt": "order sku-1 as o-1"}


def item(x: Any, key: str) -> Any:
    return x.get(key) if isinstance(x, dict) else getattr(x, key, None)


def outputs(input: Any) -> dict[str, Any]:
    """The tool outputs in a model's input, by call id (the SDK renders a dict result with str())."""
    items = [input] if isinstance(input, str) else list(input)
    return {item(i, "call_id"): ast.literal_eval(item(i, "output")) for i in items
            if item(i, "type") == "function_call_output"}


def usage(turn: int) -> AgentsUsage:
    """What turn ``turn`` spent: 1000 + 100 * turn input tokens (400 of them cached), 50 output."""
    return AgentsUsage(requests=1, input_tokens=1000 + 100 * turn, output_tokens=50,
                       total_tokens=1050 + 100 * turn,
                       input_tokens_details=InputTokensDetails(cached_tokens=400, cache_write_tokens=0),
                       output_tokens_details=OutputTokensDetails(reasoning_tokens=0))


class ScriptModel(Model):
    """A model answering with ``script(turn, input)`` (turn: the tool outputs it has seen)."""

    def __init__(self, script: Callable[[int, Any], list[TResponseOutputItem]]) -> None:
        self.script = script
        self.turns: list[int] = []
        self.inputs: list[Any] = []
        self.fail_at_turn: int | None = None

    async def get_response(self, system_instructions: str | None, input: Any, model_settings: Any,
                           tools: Any, output_schema: Any, handoffs: Any, tracing: Any, *,
                           previous_response_id: str | None, conversation_id: str | None,
                           prompt: Any) -> ModelResponse:
        items = [] if isinstance(input, str) else list(input)
        turn = sum(item(i, "type") == "function_call_output" for i in items)
        self.turns.append(turn)
        self.inputs.append(input)
        if turn == self.fail_at_turn:
            raise RuntimeError(f"the model is down at turn {turn}")
        return ModelResponse(output=self.script(turn, input), usage=usage(turn), response_id=f"resp-{turn}")

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError
        yield  # pragma: no cover


@dataclass
class Shop:
    """What the model and the tools really did: look the price up, save the order, answer."""

    tools: list[str] = field(default_factory=list)
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    final: str = "saved {id} for {price}"
    model: ScriptModel = field(init=False)

    def __post_init__(self) -> None:
        self.model = ScriptModel(self.respond)

    @property
    def model_turns(self) -> list[int]:
        """The turns the model was asked (the tool outputs it had seen)."""
        return self.model.turns

    @property
    def fail_at_turn(self) -> int | None:
        """The turn at which the model raises (None: never)."""
        return self.model.fail_at_turn

    @fail_at_turn.setter
    def fail_at_turn(self, turn: int | None) -> None:
        self.model.fail_at_turn = turn

    def respond(self, turn: int, input: Any) -> list[TResponseOutputItem]:
        seen = outputs(input)
        if turn == 0:
            return [function_call("lookup", {"sku": "sku-1"}, call_id="call-lookup")]
        price = seen["call-lookup"]["price"]
        if turn == 1:
            return [function_call("save", {"order": "o-1", "price": price}, call_id="call-save")]
        return [assistant_message(self.final.format(id=seen["call-save"]["external_id"], price=price))]

    def agent(self, **kw: Any) -> RunlogAgent:
        @function_tool
        def lookup(sku: str) -> dict[str, Any]:
            """Look a price up."""
            self.tools.append(f"lookup:{sku}")
            return {"sku": sku, "price": 1200}

        @function_tool(failure_error_function=None)
        async def save(order: str, price: int) -> dict[str, Any]:
            """Save an order."""
            call = current_call()
            self.tools.append(f"save:{order}")
            await asyncio.sleep(0)
            assert call.delivery_key and call.idempotency_key
            self.rows.setdefault(call.delivery_key, {"order": order, "price": price})
            return {"external_id": f"row-{order}"}

        save_tool = tool(SAVE, policy=ReplayPolicy.IDEMPOTENT, effect=True, target="db:orders",
                         delivery=lambda args, call: ("acct", "db", args["order"], "1"))(_not_called)
        agent = Agent(name="shop", instructions="You sell things.", model=self.model, tools=[lookup, save])
        return RunlogAgent(agent, tools={"save": save_tool}, **kw)


def _not_called(call: Any, **args: Any) -> Any:
    raise AssertionError("a mapped tool's fn is not called")


def one_stage(durable: RunlogAgent, name: str = "shop") -> Workflow:
    wf = Workflow(name, "1")

    @wf.stage("order", rules=[rule("answered", lambda out: out["answer"].startswith("saved"))])
    async def order(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        result = await durable.run(ctx, ctx.params["prompt"], run_config=CONFIG)
        return {"answer": result.final_output}

    return wf
