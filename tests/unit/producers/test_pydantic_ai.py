"""What is Pydantic AI's own in a durable agent's run inside an async stage, on the in-memory adapters
(no broker, no Redis, no network: the models are Pydantic AI's ``FunctionModel``): the recorded
request, a conversation passed on across stages, tools' control flow and rich results, and what an
effect tool may not answer. What every integration does is tested in ``test_agent_integrations.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, BinaryContent, ModelRetry
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from runlog.producers import AsyncStageContext, ReplayPolicy, Workflow, tool
from runlog.producers.pydantic_ai import RunlogAgent, dump_messages, load_messages
from runlog.schemas import EventType
from runlog.schemas.errors import TerminalToolError, WorkflowDefinitionError
from tests.unit.producers._agent_world import World
from tests.unit.producers._pydantic_shop import LOOKUP, MODEL, PROMPT, SAVE, Shop, one_stage

T = EventType


class Point(BaseModel):
    x: int
    y: int


def test_a_model_request_records_its_messages_without_what_changes_on_every_run(world: World) -> None:
    res = world.runner.run(one_stage(Shop().agent()), PROMPT)
    args = world.call_args(res.run_id, MODEL, 0)  # the messages as JSON, and the tool definitions
    assert set(args) == {"model", "system", "messages", "model_settings", "parameters"}
    assert args["messages"][0]["parts"][0]["content"] == PROMPT["prompt"]
    assert "timestamp" not in args["messages"][0] and "run_id" not in args["messages"][0]
    assert [t["name"] for t in args["parameters"]["function_tools"]] == ["lookup", "save"]


def test_an_agent_spans_stages_by_passing_its_messages_on(world: World) -> None:
    shop = Shop()
    durable = shop.agent()
    wf = Workflow("shop-2", "1")

    @wf.stage("research")
    async def research(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        result = await durable.run(ctx, "look sku-1 up", usage_limits=None)
        return {"messages": dump_messages(result.all_messages())}

    @wf.stage("order")
    async def order(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        history = load_messages(ctx.output_of("research")["messages"])
        result = await durable.run(ctx, "now save it", message_history=history)
        return {"answer": result.output, "turns": len(result.all_messages())}

    first = world.runner.run(wf, {})
    assert first.completed
    assert world.called(first.run_id) == [MODEL, LOOKUP, MODEL, MODEL, SAVE, MODEL]
    assert [e.call_id for e in world.events(first.run_id) if e.type is T.TOOL_CALLED][3:] == [
        f"order/{MODEL}/0", f"order/{SAVE}/1", f"order/{MODEL}/2"]
    assert first.outputs["order"] == {"answer": "saved row-o-1 for 1200", "turns": 8}
    assert shop.model_turns == [0, 1, 2, 3]
    before = (list(shop.model_turns), list(shop.tools))
    again = world.again(first.run_id, wf, {}, recorded_calls=world.recorded(first.run_id))
    assert again.outputs["order"] == first.outputs["order"] and (shop.model_turns, shop.tools) == before


def test_tool_control_flow_and_rich_results_are_recorded_and_read_back(world: World) -> None:
    said: list[Any] = []

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("point", {"x": 1}), ToolCallPart("image", {})])
        if len(messages) == 3:
            return ModelResponse(parts=[ToolCallPart("point", {"x": 2})])
        said.append([p.content for p in messages[-1].parts if isinstance(p, ToolReturnPart)])
        return ModelResponse(parts=[TextPart("ok")])

    agent = Agent(FunctionModel(respond), name="rich")
    ran: list[int] = []

    @agent.tool_plain
    def point(x: int) -> Point:
        ran.append(x)
        if x == 1:
            raise ModelRetry("x must be even")
        return Point(x=x, y=x * 2)

    @agent.tool_plain
    def image() -> BinaryContent:
        return BinaryContent(b"\x89PNG", media_type="image/png")

    durable = RunlogAgent(agent)
    wf = Workflow("rich", "1")

    @wf.stage("s")
    async def s(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"out": (await durable.run(ctx, "go")).output}

    first = world.runner.run(wf, {})
    assert first.completed and ran == [1, 2] and said == [[{"x": 2, "y": 4}]]
    results = [e for e in world.events(first.run_id) if e.type is T.TOOL_RESULT]
    # the first turn's two tools run at once: their results are in the order they finished
    tools = sorted(e.tool for e in results[1:3])
    assert tools == ["pydantic_ai.tool.rich.image", "pydantic_ai.tool.rich.point"]
    assert [e.tool for e in results[3:]] == ["pydantic_ai.model.rich", "pydantic_ai.tool.rich.point",
                                             "pydantic_ai.model.rich"]
    again = world.again(first.run_id, wf, {}, recorded_calls=world.recorded(first.run_id))
    assert again.completed and ran == [1, 2]  # the retry and the model were read back, nothing ran


def test_a_tool_result_reaches_the_model_in_its_recorded_form_in_the_first_run_too(world: World) -> None:
    """A dict's keys in the order the tool wrote them would reach the model in the first run, sorted
    (as recorded) in a re-run or a replay: another prompt, other tokens, a replay that reports a
    change that did not happen. The recorded form, every time."""
    seen: list[str] = []

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("price", {"sku": "a"})])
        seen.extend(repr(p.content) for p in messages[-1].parts if isinstance(p, ToolReturnPart))
        return ModelResponse(parts=[TextPart("ok")])

    agent = Agent(FunctionModel(respond), name="ordered")

    @agent.tool_plain
    def price(sku: str) -> dict[str, Any]:
        return {"sku": sku, "price": 1200}  # not in sorted order

    durable = RunlogAgent(agent)
    wf = Workflow("ordered", "1")

    @wf.stage("s")
    async def s(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"out": (await durable.run(ctx, "go")).output}

    first = world.runner.run(wf, {})
    assert first.completed and seen == ["{'price': 1200, 'sku': 'a'}"]
    models = [c for c in world.recorded(first.run_id) if "model" in c]
    again = world.again(first.run_id, wf, {}, recorded_calls={  # the model asked anew, the tool served
        k: v for k, v in world.recorded(first.run_id).items() if k not in models})
    assert again.completed and seen == ["{'price': 1200, 'sku': 'a'}"] * 2


def test_what_is_not_json_data_is_refused_with_a_clear_error(world: World) -> None:
    class Opaque:
        pass

    agent = Agent(FunctionModel(lambda m, i: ModelResponse(parts=[ToolCallPart("opaque", {})])
                                if len(m) == 1 else ModelResponse(parts=[TextPart("x")])), name="o")

    @agent.tool_plain
    def opaque() -> Any:
        return Opaque()

    durable = RunlogAgent(agent)
    wf = Workflow("opaque", "1")

    @wf.stage("s")
    async def s(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"out": (await durable.run(ctx, "go")).output}

    with pytest.raises(WorkflowDefinitionError, match=r"result of tool 'opaque'.*not JSON data"):
        world.runner.run(wf, {})

    wf2 = Workflow("opaque-settings", "1")

    @wf2.stage("s")
    async def s2(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"out": (await durable.run(ctx, "go", model_settings={"extra_body": Opaque()})).output}

    with pytest.raises(WorkflowDefinitionError, match=r"model settings.*not JSON data"):
        world.runner.run(wf2, {})


def test_an_agent_without_a_name_is_refused() -> None:
    agent = Agent(FunctionModel(lambda m, i: ModelResponse(parts=[TextPart("x")])))
    with pytest.raises(WorkflowDefinitionError, match=r"needs a name .*Agent\(name=\.\.\.\)"):
        RunlogAgent(agent)
    assert RunlogAgent(agent, name="a").model_tool.name == "pydantic_ai.model.a"


def test_an_effect_tool_may_not_answer_with_a_retry(world: World) -> None:
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[ToolCallPart("send", {"to": "x"})])

    agent = Agent(FunctionModel(respond), name="mail")

    @agent.tool_plain
    def send(to: str) -> dict[str, Any]:
        raise ModelRetry("no such address")

    send_tool = tool("mail.send", policy=ReplayPolicy.IDEMPOTENT, effect=True, target="mail",
                     delivery=lambda args, call: ("acct", "mail", args["to"], "1"))(send)
    durable = RunlogAgent(agent, tools={"send": send_tool})
    wf = Workflow("mail", "1")

    @wf.stage("s")
    async def s(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"out": (await durable.run(ctx, "go")).output}

    with pytest.raises(TerminalToolError, match=r"effect tool 'mail.send' .* raised ModelRetry"):
        world.runner.run(wf, {})
    assert world.effect_failed_undone("s/mail.send/1")  # the effect did not happen: its key is free again
