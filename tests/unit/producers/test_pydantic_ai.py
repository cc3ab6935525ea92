"""A Pydantic AI agent run inside an async stage, on the in-memory adapters (no broker, no Redis, no
network: the models are Pydantic AI's ``FunctionModel``).

Each model request and each agent tool call is one recorded Runlog call; re-executing the stage with
the recorded calls calls neither the model nor the tools; an unrecorded turn after recorded ones is
asked of the model; a changed request at a recorded position diverges and blocks the run.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
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
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from runlog.producers import AsyncRunner, AsyncStageContext, ReplayPolicy, Workflow, load_args, rule, tool
from runlog.producers.calls._keys import canonical_json, sha256_hex
from runlog.producers.log._memory import (
    InMemoryLeaseManager,
)
from runlog.producers.pydantic_ai import RunlogAgent, current_call, dump_messages, load_messages
from runlog.projections import RunStatus
from runlog.projections.fold import fold_all
from runlog.schemas import Diverged, EventType
from runlog.schemas.errors import TerminalToolError, WorkflowDefinitionError
from tests.unit.producers._replay import MemoryWorld

T = EventType
MODEL = "pydantic_ai.model.shop"
LOOKUP = "pydantic_ai.tool.shop.lookup"
SAVE = "orders.save"


class Point(BaseModel):
    x: int
    y: int


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

    def agent(self) -> RunlogAgent[None, str]:
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
        return RunlogAgent(agent, tools={"save": save_tool})


class World(MemoryWorld):
    """The in-memory adapters and a runner (:class:`~tests.unit.producers._replay.MemoryWorld`)."""

    def called(self, run_id: str) -> list[str]:
        return [e.tool or "" for e in self.events(run_id) if e.type is T.TOOL_CALLED]


def one_stage(durable: RunlogAgent[None, str]) -> Workflow:
    wf = Workflow("shop", "1")

    @wf.stage("order", rules=[rule("answered", lambda out: out["answer"].startswith("saved"))])
    async def order(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        result = await durable.run(ctx, ctx.params["prompt"])
        return {"answer": result.output}

    return wf


@pytest.fixture
def world() -> Iterator[World]:
    w = World()
    yield w
    w.runner.close()


PROMPT = {"prompt": "order sku-1 as o-1"}


def test_each_model_request_and_tool_call_is_one_recorded_call(world: World) -> None:
    shop = Shop()
    durable = shop.agent()
    res = world.runner.run(one_stage(durable), PROMPT)
    assert res.completed and res.outputs == {"order": {"answer": "saved row-o-1 for 1200"}}
    assert shop.model_turns == [0, 1, 2] and shop.tools == ["lookup:sku-1", "save:o-1"]
    assert world.called(res.run_id) == [MODEL, LOOKUP, MODEL, SAVE, MODEL]
    evs = world.events(res.run_id)
    assert [e.call_id for e in evs if e.type is T.TOOL_CALLED] == [
        f"order/{MODEL}/0", f"order/{LOOKUP}/1", f"order/{MODEL}/2", f"order/{SAVE}/3", f"order/{MODEL}/4"]
    policies = {e.tool: e.replay_policy for e in evs if e.type is T.TOOL_CALLED}
    assert policies == {MODEL: ReplayPolicy.SAFE, LOOKUP: ReplayPolicy.SAFE, SAVE: ReplayPolicy.IDEMPOTENT}
    intent = [e for e in evs if e.type is T.EFFECT_INTENT]
    assert [e.call_id for e in intent] == [f"order/{SAVE}/3"] and intent[0].target == "db:orders"
    [effect] = [e for e in evs if e.type is T.EFFECT_RESULT]
    assert effect.external_id == "row-o-1" and effect.delivery_key in shop.rows
    done = world.ledger.lookup(effect.delivery_key or "")
    assert done is not None and done.done and done.external_id == "row-o-1"
    state = fold_all(evs)
    assert state is not None and state.status is RunStatus.COMPLETED and state.rejected_total == 0
    # the recorded request: the messages as JSON, without what changes on every run; the messages
    # and tool definitions by reference (stored once), the request hash over the whole request
    called = [e for e in evs if e.type is T.TOOL_CALLED and e.tool == MODEL]
    assert called[0].payload_ref is not None
    recorded = json.loads(world.store.get(called[0].payload_ref))
    assert set(recorded["args"]) == {"model", "system", "model_settings"}
    assert set(recorded["refs"]) == {"messages", "parameters"}
    args = load_args(world.store, called[0].payload_ref)
    assert sha256_hex(canonical_json(args)) == called[0].request_hash
    assert set(args) == {"model", "system", "messages", "model_settings", "parameters"}
    assert args["messages"][0]["parts"][0]["content"] == PROMPT["prompt"]
    assert "timestamp" not in args["messages"][0] and "run_id" not in args["messages"][0]
    assert [t["name"] for t in args["parameters"]["function_tools"]] == ["lookup", "save"]


def test_re_executing_with_the_recorded_calls_calls_neither_model_nor_tools(world: World) -> None:
    shop = Shop()
    wf = one_stage(shop.agent())
    first = world.runner.run(wf, PROMPT)
    n = len(world.events(first.run_id))
    res = world.again(first.run_id, wf, PROMPT, recorded_calls=world.recorded(first.run_id))
    assert res.completed and res.epoch == 2 and res.outputs == first.outputs
    assert shop.model_turns == [0, 1, 2] and shop.tools == ["lookup:sku-1", "save:o-1"]  # nothing again
    tail = world.events(first.run_id)[n:]
    assert [e.type for e in tail] == [T.LEASE_ACQUIRED, T.STAGE_STARTED, T.VERIFIED, T.RUN_COMPLETED]


def test_an_unrecorded_turn_after_recorded_ones_is_asked_of_the_model(world: World) -> None:
    shop = Shop(fail_at_turn=2)  # the first run dies at its last model request
    wf = one_stage(shop.agent())
    with pytest.raises(RuntimeError, match="down at turn 2"):
        world.runner.run(wf, PROMPT)
    [run_id] = world.log.run_ids()
    failed = fold_all(world.events(run_id))
    assert failed is not None and failed.status is RunStatus.FAILED
    recorded = world.recorded(run_id)
    assert [r.result is not None for r in recorded.values()] == [True, True, True, True, False]
    shop.fail_at_turn, shop.final = None, "saved {id} for {price}, said differently"
    res = world.again(run_id, wf, PROMPT, recorded_calls=recorded)
    assert res.completed and res.outputs == {"order": {"answer": "saved row-o-1 for 1200, said differently"}}
    assert shop.model_turns == [0, 1, 2, 2]  # turns 0 and 1 read back, turn 2 asked again
    assert shop.tools == ["lookup:sku-1", "save:o-1"]


def test_a_changed_prompt_at_a_recorded_position_diverges_and_blocks_the_run(world: World) -> None:
    shop = Shop()
    wf = one_stage(shop.agent())
    first = world.runner.run(wf, PROMPT)
    n = len(world.events(first.run_id))
    with pytest.raises(Diverged) as info:
        world.again(first.run_id, wf, {"prompt": "order sku-2 as o-2"},
                    recorded_calls=world.recorded(first.run_id))
    assert info.value.call_id == f"order/{MODEL}/0"
    assert shop.model_turns == [0, 1, 2] and shop.tools == ["lookup:sku-1", "save:o-1"]
    tail = world.events(first.run_id)[n:]
    assert [e.type for e in tail] == [T.LEASE_ACQUIRED, T.STAGE_STARTED, T.CALL_DIVERGED, T.RUN_BLOCKED]
    state = fold_all(world.events(first.run_id))
    assert state is not None and state.status is RunStatus.BLOCKED


def test_another_tool_set_at_a_recorded_position_diverges(world: World) -> None:
    shop = Shop()
    durable = shop.agent()
    first = world.runner.run(one_stage(durable), PROMPT)

    @durable.agent.tool_plain  # type: ignore[attr-defined]
    def extra() -> str:
        return "new tool: the model request's tool definitions differ"

    with pytest.raises(Diverged):
        world.again(first.run_id, one_stage(durable), PROMPT, recorded_calls=world.recorded(first.run_id))


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
    assert results[1].tool == "pydantic_ai.tool.rich.point"
    again = world.again(first.run_id, wf, {}, recorded_calls=world.recorded(first.run_id))
    assert again.completed and ran == [1, 2]  # the retry and the model were read back, nothing ran


def test_the_async_runner_runs_a_durable_agent(world: World) -> None:
    shop = Shop()
    wf = one_stage(shop.agent())

    async def main() -> Any:
        runner = AsyncRunner(world.log, InMemoryLeaseManager(world.table, holder="w-async"), world.store,
                             ledger=world.ledger, run_log=world.log)
        try:
            return await runner.run(wf, PROMPT)
        finally:
            await runner.aclose()

    res = asyncio.run(main())
    assert res.completed and res.outputs == {"order": {"answer": "saved row-o-1 for 1200"}}
    assert world.called(res.run_id) == [MODEL, LOOKUP, MODEL, SAVE, MODEL]


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


def test_declarations_are_checked() -> None:
    agent = Agent(FunctionModel(lambda m, i: ModelResponse(parts=[TextPart("x")])))
    with pytest.raises(WorkflowDefinitionError, match="needs a name"):
        RunlogAgent(agent)
    with pytest.raises(WorkflowDefinitionError, match="without '/'"):
        RunlogAgent(agent, name="a/b")
    with pytest.raises(WorkflowDefinitionError, match="tools_policy must be SAFE or IDEMPOTENT"):
        RunlogAgent(agent, name="a", tools_policy=ReplayPolicy.NEVER)
    with pytest.raises(WorkflowDefinitionError, match="must be a Runlog Tool"):
        RunlogAgent(agent, name="a", tools={"x": "not a tool"})  # type: ignore[dict-item]
    durable = RunlogAgent(agent, name="a", model_policy=ReplayPolicy.IDEMPOTENT)
    assert durable.model_tool.name == "pydantic_ai.model.a"
    assert durable.model_tool.policy is ReplayPolicy.IDEMPOTENT
    assert durable.tool_for("t").name == "pydantic_ai.tool.a.t" and durable.tools() == [durable.model_tool]
    with pytest.raises(RuntimeError, match="only available inside a tool call"):
        current_call()


def test_importing_without_pydantic_ai_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "runlog.producers.pydantic_ai")
    monkeypatch.setitem(sys.modules, "pydantic_ai", None)  # type: ignore[arg-type]
    with pytest.raises(ImportError, match=r'pip install "runlog\[pydantic-ai\]"'):
        importlib.import_module("runlog.producers.pydantic_ai")


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
    [run_id] = world.log.run_ids()
    failed = [e for e in world.events(run_id) if e.type is T.FAILED]
    assert failed[0].call_id == "s/mail.send/1" and failed[0].delivery_key
    entry = world.ledger.lookup(failed[0].delivery_key or "")
    assert entry is not None and not entry.done  # the effect did not happen: its key is free again
