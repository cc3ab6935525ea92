"""What is the OpenAI Agents SDK's own in a durable agent's run inside an async stage, on the in-memory
adapters (no broker, no Redis, no network: the model implements the SDK's ``Model`` interface with
scripted responses): the recorded request and response in the SDK's wire form, what a model call
spent, concurrent tool calls, what the SDK runs outside the log (refused), hosted tools. What every
integration does is tested in ``test_agent_integrations.py``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from agents import (
    Agent,
    ComputerTool,
    Handoff,
    ModelSettings,
    RunConfig,
    ToolGuardrailFunctionOutput,
    ToolInputGuardrailData,
    WebSearchTool,
    function_tool,
    tool_input_guardrail,
)
from agents.testing import assistant_message, function_call

from runlog.producers import AsyncStageContext, Price, ReplayPolicy, Workflow, tool
from runlog.producers.openai_agents import RunlogAgent
from runlog.projections.fold import fold_all
from runlog.schemas import Diverged, EventType
from runlog.schemas.errors import TerminalToolError, WorkflowDefinitionError
from tests.unit.producers._agent_world import World, open_world
from tests.unit.producers._openai_shop import (
    CONFIG,
    MODEL,
    PROMPT,
    ScriptModel,
    Shop,
    one_stage,
)

T = EventType


def test_a_model_call_records_its_request_and_response_in_the_sdks_wire_form(world: World) -> None:
    res = world.runner.run(one_stage(Shop().agent()), PROMPT)
    args = world.call_args(res.run_id, MODEL, 1)  # the instructions, the input items, the tools
    assert args["model"] == "ScriptModel" and args["instructions"] == "You sell things."
    assert [i.get("type") for i in args["input"]] == [None, "function_call", "function_call_output"]
    assert args["input"][0] == {"content": PROMPT["prompt"], "role": "user"}
    assert [t["name"] for t in args["tools"]] == ["lookup", "save"]
    assert args["tools"][0]["parameters"]["properties"]["sku"]["type"] == "string"
    # the recorded response: the output items in their wire form, read back as the SDK's items
    results = [e for e in world.events(res.run_id) if e.type is T.TOOL_RESULT and e.tool == MODEL]
    assert results[0].payload_ref is not None
    response = json.loads(world.store.get(results[0].payload_ref))
    assert response["output"] == [{"arguments": '{"sku":"sku-1"}', "call_id": "call-lookup",
                                   "id": "call-lookup", "name": "lookup", "type": "function_call"}]
    assert response["response_id"] == "resp-0"


def test_what_a_model_call_spent_is_recorded_with_it_and_priced() -> None:
    shop = Shop()
    with open_world(prices={"ScriptModel": Price(input=2, output=8, cache_read="0.5")}) as priced:
        res = priced.runner.run(one_stage(shop.agent()), PROMPT)
        evs = priced.events(res.run_id)
    spent = [e.usage for e in evs if e.type is T.TOOL_RESULT]
    assert [u is None for u in spent] == [False, True, False, True, False]  # the model calls only
    first = spent[0]
    assert first is not None and first.model == "ScriptModel"
    assert (first.input_tokens, first.output_tokens, first.cache_read_tokens, first.cache_write_tokens) == (
        1000, 50, 400, 0)
    assert first.cost_nanos == 600 * 2000 + 400 * 500 + 50 * 8000  # 1 $ per M tokens is 1000 nanos a token
    assert [u.input_tokens for u in spent if u] == [1000, 1100, 1200]
    state = fold_all(evs)
    assert state is not None and state.usage.input_tokens == 3300 and state.usage.output_tokens == 150


def test_tool_calls_of_one_response_keep_the_responses_order_however_they_run(world: World) -> None:
    """The first call of a response starts last (a guardrail holds it) and finishes last: its
    position is still the first, taken when the response arrived, so a replay finds it there."""
    events: list[str] = []

    def script(turn: int, input: Any) -> list[Any]:
        if turn == 0:
            return [function_call("slow", {"n": 1}, call_id="c-slow"), function_call("fast", {"n": 2},
                                                                                    call_id="c-fast")]
        return [assistant_message("done")]

    @tool_input_guardrail
    async def hold(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
        await asyncio.sleep(0.05)
        return ToolGuardrailFunctionOutput.allow()

    @function_tool(tool_input_guardrails=[hold])
    async def slow(n: int) -> int:
        """Slow."""
        events.append("slow")
        return n

    @function_tool
    async def fast(n: int) -> int:
        """Fast."""
        events.append("fast")
        return n

    model = ScriptModel(script)
    durable = RunlogAgent(Agent(name="par", model=model, tools=[slow, fast]))
    wf = Workflow("par", "1")

    @wf.stage("s")
    async def s(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"out": (await durable.run(ctx, "go", run_config=CONFIG)).final_output}

    first = world.runner.run(wf, {})
    assert first.completed and events == ["fast", "slow"]  # they ran concurrently, the second first
    assert [e.call_id for e in world.events(first.run_id) if e.type is T.TOOL_CALLED] == [
        "s/openai_agents.model.par/0", "s/openai_agents.tool.par.fast/2", "s/openai_agents.tool.par.slow/1",
        "s/openai_agents.model.par/3"]
    again = world.again(first.run_id, wf, {}, recorded_calls=world.recorded(first.run_id))
    assert again.completed and model.turns == [0, 2] and events == ["fast", "slow"]  # read back


def test_an_effect_tool_that_answers_with_text_fails_the_call(world: World) -> None:
    def script(turn: int, input: Any) -> list[Any]:
        return [function_call("send", {"to": "x"}, call_id="c-send")]

    @function_tool  # the SDK's default failure_error_function: the exception becomes a message
    def send(to: str) -> dict[str, Any]:
        """Send mail."""
        raise ValueError("no such address")

    send_tool = tool("mail.send", policy=ReplayPolicy.IDEMPOTENT, effect=True, target="mail",
                     delivery=lambda args, call: ("acct", "mail", args["to"], "1"))(lambda call, **a: None)
    durable = RunlogAgent(Agent(name="mail", model=ScriptModel(script), tools=[send]),
                          tools={"send": send_tool})
    wf = Workflow("mail", "1")

    @wf.stage("s")
    async def s(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"out": (await durable.run(ctx, "go", run_config=CONFIG)).final_output}

    with pytest.raises(TerminalToolError, match=r"effect tool 'mail.send'.*answered with text.*"
                                                r"failure_error_function=None"):
        world.runner.run(wf, {})
    assert world.effect_failed_undone("s/mail.send/1")  # the effect did not happen: its key is free again


def test_what_is_not_json_data_is_refused_with_a_clear_error(world: World) -> None:
    class Opaque:
        pass

    @function_tool(failure_error_function=None)
    def opaque() -> Any:
        """Opaque."""
        return Opaque()

    model = ScriptModel(lambda turn, input: [function_call("opaque", {}, call_id="c")] if turn == 0
                        else [assistant_message("x")])
    durable = RunlogAgent(Agent(name="o", model=model, tools=[opaque]))
    wf = Workflow("opaque", "1")

    @wf.stage("s")
    async def s(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"out": (await durable.run(ctx, "go", run_config=CONFIG)).final_output}

    with pytest.raises(WorkflowDefinitionError, match=r"result of tool 'opaque'.*not JSON data"):
        world.runner.run(wf, {})


def test_what_the_sdk_runs_outside_the_log_is_refused(world: World) -> None:
    model = ScriptModel(lambda turn, input: [assistant_message("x")])
    refused = {
        r"handoff to 'b' was not made with handoff\(agent\)": Agent(name="h", model=model, handoffs=[
            Handoff("to_b", "b", {}, _to_b, "b")]),
        "is a ComputerTool, which runs locally": Agent(name="c", model=model,
                                                       tools=[ComputerTool(computer=object())]),  # type: ignore[arg-type]
        "needs approval": Agent(name="n", model=model, tools=[function_tool(_approve, needs_approval=True)]),
        "has a timeout": Agent(name="t", model=model,
                                     tools=[function_tool(_slow, timeout=5)]),
        r"ModelSettings.retry .* use RunlogAgent\(..., model_retry": Agent(
            name="r", model=model, model_settings=ModelSettings(retry={"max_retries": 2})),  # type: ignore[arg-type]
    }
    for i, (why, a) in enumerate(refused.items()):
        wf = Workflow(f"refused-{i}", "1")
        d = RunlogAgent(a)

        @wf.stage("s")
        async def s(ctx: AsyncStageContext, inputs: dict[str, Any], d: RunlogAgent = d) -> dict[str, Any]:
            return {"out": (await d.run(ctx, "go", run_config=CONFIG)).final_output}

        with pytest.raises(WorkflowDefinitionError, match=why):
            world.runner.run(wf, {})


async def _to_b(ctx: Any, input_json: str) -> Agent[Any]:
    return Agent(name="b")


def _approve(x: int) -> int:
    """Needs approval."""
    return x


async def _slow(x: int) -> int:
    """Has a timeout."""
    return x


def test_streaming_is_refused_with_a_clear_error() -> None:
    from runlog.producers.integrations._openai_agents_run import Run, RunlogModel

    durable = RunlogAgent(Agent(name="st"))
    model = RunlogModel(ScriptModel(lambda t, i: []), "m", durable.name, durable.model_tool,
                        Run(None))  # type: ignore[arg-type]

    async def stream() -> None:
        async for _ in model.stream_response(None, "go", ModelSettings(), [], None, [], None,  # type: ignore[arg-type]
                                             previous_response_id=None, conversation_id=None, prompt=None):
            pass

    with pytest.raises(WorkflowDefinitionError, match=r"streaming .* is not supported"):
        asyncio.run(stream())


def test_run_config_model_and_names_are_used(world: World) -> None:
    shop = Shop()
    durable = shop.agent(model_name="gpt-test")
    durable.agent.model = None  # the run config's model is used
    wf = Workflow("cfg", "1")

    @wf.stage("order")
    async def order(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        cfg = RunConfig(model=shop.model, tracing_disabled=True)
        return {"answer": (await durable.run(ctx, ctx.params["prompt"], run_config=cfg)).final_output}

    res = world.runner.run(wf, PROMPT)
    assert res.completed and shop.model.turns == [0, 1, 2]
    spent = [e.usage for e in world.events(res.run_id) if e.type is T.TOOL_RESULT and e.usage]
    assert [u.model for u in spent] == ["gpt-test"] * 3



def test_a_hosted_tools_changed_settings_diverge(world: World) -> None:
    """A tool the provider runs (web search) is part of the request with its settings."""
    model = ScriptModel(lambda turn, input: [assistant_message("saved nothing")])
    agent = Agent(name="web", model=model, tools=[WebSearchTool(search_context_size="low")])
    durable = RunlogAgent(agent)
    first = world.runner.run(one_stage(durable, "web"), PROMPT)
    assert first.completed and model.turns == [0]
    agent.tools[:] = [WebSearchTool(search_context_size="high")]
    with pytest.raises(Diverged) as info:
        world.again(first.run_id, one_stage(durable, "web"), PROMPT,
                    recorded_calls=world.recorded(first.run_id))
    assert info.value.call_id == "order/openai_agents.model.web/0" and model.turns == [0]


def test_a_failing_tool_never_cancels_a_sibling_effect_halfway(world: World) -> None:
    """The SDK cancels a response's other tool calls when one fails; an effect under way finishes its
    recorded call (its result and external id on the log, its key done in the ledger) before the
    run raises the failing tool's error."""
    done: list[str] = []

    @function_tool(failure_error_function=None)
    async def boom(x: int) -> int:
        """Fails."""
        raise ValueError("boom")

    @function_tool(failure_error_function=None)
    async def save(order: str) -> dict[str, Any]:
        """Saves, slowly."""
        await asyncio.sleep(0.1)
        done.append(order)
        return {"external_id": f"row-{order}"}

    save_tool = tool("orders.save", policy=ReplayPolicy.IDEMPOTENT, effect=True, target="db",
                     delivery=lambda args, call: ("acct", "db", args["order"], "1"))(lambda call, **a: None)
    model = ScriptModel(lambda turn, input: [function_call("save", {"order": "o-1"}, call_id="c1"),
                                             function_call("boom", {"x": 1}, call_id="c2")])
    durable = RunlogAgent(Agent(name="sib", model=model, tools=[save, boom]), tools={"save": save_tool})
    wf = Workflow("sib", "1")

    @wf.stage("s")
    async def s(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"out": (await durable.run(ctx, "go", run_config=CONFIG)).final_output}

    with pytest.raises(ValueError, match="boom"):
        world.runner.run(wf, {})
    [run_id] = world.log.run_ids()
    evs = world.events(run_id)
    assert done == ["o-1"]
    [effect] = [e for e in evs if e.type is T.EFFECT_RESULT]
    assert effect.call_id == "s/orders.save/1" and effect.external_id == "row-o-1"
    assert [e.call_id for e in evs if e.type is T.TOOL_RESULT][-1] == "s/orders.save/1"
    entry = world.ledger.lookup(effect.delivery_key or "")
    assert entry is not None and entry.done
