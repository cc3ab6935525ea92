"""What the OpenAI Agents SDK does around a model call or a tool call stays as the SDK does it when
the agent is durable (in-memory adapters, scripted models): the settings the SDK gives a model named
by a string, its own answer to a typed tool's exception, and an agent given as a tool, which runs
inside the outer agent's recorded tool call on its own model or the run config's."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from agents import Agent, ModelProvider, ModelSettings, RunConfig, Runner, function_tool
from agents.models import get_default_model_settings
from agents.testing import assistant_message, function_call
from pydantic import BaseModel

from runlog.producers import AsyncStageContext, Budget, Workflow, load_args
from runlog.producers.calls._call_budget import BudgetExceeded
from runlog.producers.openai_agents import RunlogAgent
from runlog.projections import RunStatus
from runlog.projections.fold import fold_all
from runlog.schemas import EventType
from tests.unit.producers._openai_shop import CONFIG, PROMPT, ScriptModel, Shop, item, one_stage
from tests.unit.producers._replay import MemoryWorld

T = EventType


class Quote(BaseModel):
    price: int


@pytest.fixture
def world() -> Iterator[MemoryWorld]:
    w = MemoryWorld()
    yield w
    w.runner.close()


def test_a_tools_error_answered_by_the_sdk_replays_as_the_sdks_answer(world: MemoryWorld) -> None:
    """A typed tool (``output_type``) whose exception the SDK's default failure handler answers: the
    answer bypasses the output schema in the first run, and must on replay too (else the recorded
    message fails the schema)."""

    calls: list[int] = []

    @function_tool(output_type=Quote)
    def quote(sku: str) -> Quote:
        """Quote a price."""
        calls.append(1)
        raise ValueError("no such sku")

    def script(turn: int, input: Any) -> list[Any]:
        said = [item(i, "output") for i in input if item(i, "type") == "function_call_output"]
        return [assistant_message(f"said: {said[0]}")] if said else [function_call("quote", {"sku": "x"},
                                                                                  call_id="c")]

    model = ScriptModel(script)
    durable = RunlogAgent(Agent(name="q", model=model, tools=[quote]))
    wf = Workflow("quote", "1")

    @wf.stage("s")
    async def s(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"out": (await durable.run(ctx, "go", run_config=CONFIG)).final_output}

    first = world.runner.run(wf, {})
    assert first.completed and "error occurred while running the tool" in first.outputs["s"]["out"]
    assert calls == [1]
    again = world.again(first.run_id, wf, {}, recorded_calls=world.recorded(first.run_id))
    assert again.completed and again.outputs == first.outputs and calls == [1] and model.turns == [0, 1]


class _Provider(ModelProvider):
    """Resolves every model name to one scripted model (what it was asked for is kept)."""

    def __init__(self, model: ScriptModel) -> None:
        self.model = model
        self.asked: list[str | None] = []

    def get_model(self, model_name: str | None) -> ScriptModel:
        self.asked.append(model_name)
        return self.model


def test_a_model_given_by_name_gets_the_settings_the_sdk_gives_it(world: MemoryWorld) -> None:
    """The SDK gives a model named ``gpt-5.2`` its default settings; the durable run must ask the
    model with the same settings as a plain ``Runner.run`` (not the empty ones of a Model object)."""
    said: list[Any] = []

    class Recording(ScriptModel):
        async def get_response(self, system_instructions: Any, input: Any, model_settings: Any,
                               *args: Any, **kwargs: Any) -> Any:
            said.append(model_settings.to_json_dict())
            return await super().get_response(system_instructions, input, model_settings, *args, **kwargs)

    provider = _Provider(Recording(lambda turn, input: [assistant_message("hi")]))
    agent = Agent(name="named", model="gpt-5.2")
    config = RunConfig(model_provider=provider, tracing_disabled=True)
    asyncio.run(Runner.run(agent, "go", run_config=config))
    plain = said.pop()
    assert plain == get_default_model_settings("gpt-5.2").to_json_dict()
    assert plain != ModelSettings().to_json_dict()
    durable = RunlogAgent(agent)
    wf = Workflow("named", "1")

    @wf.stage("s")
    async def s(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"out": (await durable.run(ctx, "go", run_config=config)).final_output}

    res = world.runner.run(wf, {})
    assert res.completed and said == [plain] and provider.asked == ["gpt-5.2", "gpt-5.2"]
    [called] = [e for e in world.events(res.run_id) if e.type is T.TOOL_CALLED]
    assert called.payload_ref is not None
    args = load_args(world.store, called.payload_ref)
    assert args["model"] == "gpt-5.2" and args["model_settings"] == plain


def test_an_agent_as_a_tool_is_one_recorded_call_with_its_own_model(world: MemoryWorld) -> None:
    """A sub-agent given as a tool (``as_tool``) runs inside the outer agent's recorded tool call, on
    its own model: its model calls are part of that call (read back whole on replay), not calls of
    the outer agent's model at positions of their own."""
    inner_model = ScriptModel(lambda turn, input: [assistant_message("inner says 42")])
    inner = Agent(name="inner", model=inner_model)
    outer_model = ScriptModel(lambda turn, input: [function_call("ask_inner", {"input": "q"}, call_id="c")]
                              if turn == 0 else [assistant_message("done")])
    outer = Agent(name="outer", model=outer_model,
                  tools=[inner.as_tool(tool_name="ask_inner", tool_description="Ask the inner agent.")])
    durable = RunlogAgent(outer)
    wf = Workflow("nested", "1")

    @wf.stage("s")
    async def s(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"out": (await durable.run(ctx, "go", run_config=CONFIG)).final_output}

    first = world.runner.run(wf, {})
    assert first.completed and outer_model.turns == [0, 1] and inner_model.turns == [0]
    assert [e.call_id for e in world.events(first.run_id) if e.type is T.TOOL_CALLED] == [
        "s/openai_agents.model.outer/0", "s/openai_agents.tool.outer.ask_inner/1",
        "s/openai_agents.model.outer/2"]
    again = world.again(first.run_id, wf, {}, recorded_calls=world.recorded(first.run_id))
    assert again.completed and outer_model.turns == [0, 1] and inner_model.turns == [0]


def test_an_agent_as_a_tool_on_the_run_configs_model_is_part_of_the_tool_call(world: MemoryWorld) -> None:
    """With the model given in the run config, a sub-agent given as a tool asks that model too (as
    the SDK does): inside the recorded tool call, so it is not recorded at a position of its own and
    a replay (which reads the tool call back whole) finds every position where it was."""

    def script(turn: int, input: Any) -> list[Any]:
        if input == "q":
            return [assistant_message("inner says 42")]
        return [function_call("ask_inner", {"input": "q"}, call_id="c")] if turn == 0 else [
            assistant_message("done")]

    model = ScriptModel(script)
    inner = Agent(name="inner")
    outer = Agent(name="outer", tools=[inner.as_tool(tool_name="ask_inner", tool_description="Ask it.")])
    durable = RunlogAgent(outer)
    wf = Workflow("nested-config", "1")

    @wf.stage("s")
    async def s(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        config = RunConfig(model=model, tracing_disabled=True)
        return {"out": (await durable.run(ctx, "go", run_config=config)).final_output}

    first = world.runner.run(wf, {})
    assert first.completed and model.turns == [0, 0, 1]  # outer, inner (inside the tool call), outer
    assert [e.call_id for e in world.events(first.run_id) if e.type is T.TOOL_CALLED] == [
        "s/openai_agents.model.outer/0", "s/openai_agents.tool.outer.ask_inner/1",
        "s/openai_agents.model.outer/2"]
    again = world.again(first.run_id, wf, {}, recorded_calls=world.recorded(first.run_id))
    assert again.completed and model.turns == [0, 0, 1]


@pytest.mark.parametrize("on_exceeded", ["fail", "wait"])
def test_a_budget_stops_the_model_call_that_would_exceed_it(world: MemoryWorld, on_exceeded: str) -> None:
    """The model calls report their usage, so a run's budget applies to them: the call after the
    cap is not made; the run fails with BudgetExceeded, or waits for ``runlog budget`` (the SDK's
    wrapping of errors does not hide either)."""
    shop = Shop()
    durable = shop.agent()
    wf = one_stage(durable, f"budget-{on_exceeded}")
    # turn 0 spends 1050 tokens, turn 1 1150: after them 2200, and the next (about 1100 more) would pass
    wf.budget = Budget(tokens=2200, on_exceeded=on_exceeded)
    if on_exceeded == "fail":
        with pytest.raises(BudgetExceeded):
            world.runner.run(wf, PROMPT)
        [run_id] = world.log.run_ids()
    else:
        res = world.runner.run(wf, PROMPT)
        assert not res.completed and res.waiting is not None
        run_id = res.run_id
    assert shop.model.turns == [0, 1]  # the third call was not made
    state = fold_all(world.events(run_id))
    assert state is not None and state.usage.calls == 2
    assert state.status is (RunStatus.FAILED if on_exceeded == "fail" else RunStatus.WAITING)
