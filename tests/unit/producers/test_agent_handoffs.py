"""Sub-agents as child runs in the agent integrations, in the in-memory world: an OpenAI Agents SDK
handoff (and an agent as a tool, with ``agent_tools="child"``) and a Pydantic AI tool that delegates
(``delegates=`` and ``RunlogAgent.delegate``) start a child run of the sub-agent's workflow; the parent
waits for it holding nothing and completes with the sub-agent's output once the resumers have run
the child; every scripted model request is made once. The crash of a sub-agent on the real broker is
tests/integration/resume/test_agent_handoff_crash.py."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, RunConfig
from agents.testing import assistant_message, function_call
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.models.test import TestModel

from runlog import App, AsyncStageContext, DictInputSource, Workflow
from runlog.producers.openai_agents import RunlogAgent as OpenAIRunlogAgent
from runlog.producers.pydantic_ai import RunlogAgent as PydanticRunlogAgent
from runlog.projections import RunStatus
from runlog.schemas import EventType
from runlog.schemas.errors import WorkflowDefinitionError
from runlog.testing import InMemoryWorld
from tests.integration.resume._handoff_agents import (
    CHILD_ASKS,
    CHILD_WORKFLOW,
    PARENT_ASKS,
    WORKFLOW,
    World,
    app,
)
from tests.unit.producers._openai_shop import ScriptModel

CONFIG = RunConfig(tracing_disabled=True)


def _outputs(world: InMemoryWorld, run_id: str) -> dict[str, Any]:
    import json

    state = world.state(run_id)
    assert state is not None
    return {k: json.loads(world.artifacts.get(v)) for k, v in state.stage_outputs.items()}


@pytest.mark.parametrize("integration", ["openai_agents", "pydantic_ai"])
def test_a_handed_off_or_delegated_sub_agent_runs_as_a_child_run(integration: str, tmp_path: Path) -> None:
    application = app(integration, tmp_path)
    assert application.registry.get(CHILD_WORKFLOW[integration]).stages[0].name == "agent"  # registered
    world = InMemoryWorld(application)
    first = world.run(application.registry.get(WORKFLOW[integration]), {"sku": "sku-1"})
    assert first.waiting == "runlog.child" and not first.completed
    state = world.state(first.run_id)
    assert state is not None and state.status is RunStatus.WAITING
    [child_id] = state.children
    child = world.state(child_id)
    assert child is not None and child.workflow_name == CHILD_WORKFLOW[integration]
    assert child.parent_run_id == first.run_id
    world.serve()
    done = world.state(first.run_id)
    assert done is not None and done.status is RunStatus.COMPLETED
    assert _outputs(world, first.run_id) == {"ask": {"answer": "the price is 1200"}}
    assert Counter(World(tmp_path).asked()) == Counter([*PARENT_ASKS[integration], *CHILD_ASKS])
    assert World(tmp_path).lookups() == 1
    # the parent's log holds its own model calls and the child call; the child's, the sub-agent's
    parent_tools = [e.tool for e in world.events(first.run_id) if e.type is EventType.TOOL_CALLED]
    assert parent_tools.count("runlog.child") == 1
    assert not any(t and "researcher" in t for t in parent_tools)
    child_tools = [e.tool for e in world.events(child_id) if e.type is EventType.TOOL_CALLED]
    assert child_tools == [f"{integration}.model.researcher", f"{integration}.tool.researcher.lookup",
                           f"{integration}.model.researcher"]


def test_an_agent_as_a_tool_runs_as_a_child_run_when_asked() -> None:
    seen: list[str] = []

    def outer_script(turn: int, input: Any) -> list[Any]:
        seen.append(f"outer:{turn}")
        if turn == 0:
            return [function_call("research", '{"input": "look up sku-1"}', call_id="c-research")]
        return [assistant_message("done")]

    def inner_script(turn: int, input: Any) -> list[Any]:
        seen.append(f"inner:{turn}")
        return [assistant_message("the price is 1200")]

    inner = Agent(name="inner", model=ScriptModel(inner_script))
    outer = Agent(name="outer", model=ScriptModel(outer_script),
                  tools=[inner.as_tool(tool_name="research", tool_description="Research a price.")])
    durable = OpenAIRunlogAgent(outer, agent_tools="child", run_config=CONFIG)
    assert [w.name for w in durable.workflows()] == ["openai_agents.agent.inner"]
    wf = Workflow("as-tool", "1")

    @wf.stage("s")
    async def s(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        result = await durable.run(ctx, "price?")
        items = [i for i in result.to_input_list()
                 if isinstance(i, dict) and i.get("type") == "function_call_output"]
        return {"out": result.final_output, "items": items}

    world = InMemoryWorld(App.of([wf, *durable.workflows()], durable.tools(), DictInputSource({})))
    first = world.run(wf, {})
    assert first.waiting == "runlog.child"
    world.serve()
    out = _outputs(world, first.run_id)["s"]
    assert out["out"] == "done" and out["items"][0]["output"] == "the price is 1200"
    assert Counter(seen) == Counter(["outer:0", "inner:0", "outer:1"])
    calls = [e.call_id for e in world.events(first.run_id) if e.type is EventType.TOOL_CALLED]
    assert calls == ["s/openai_agents.model.outer/0", "s/runlog.child/1", "s/openai_agents.model.outer/2"]


def test_declarations_of_sub_agents_are_checked() -> None:
    with pytest.raises(WorkflowDefinitionError, match="agent_tools must be 'inline' or 'child'"):
        OpenAIRunlogAgent(Agent(name="a"), agent_tools="sometimes")
    with pytest.raises(WorkflowDefinitionError, match=r"handoffs\['b'\] must be a RunlogAgent"):
        OpenAIRunlogAgent(Agent(name="a"), handoffs={"b": Agent(name="b")})  # type: ignore[dict-item]
    with pytest.raises(WorkflowDefinitionError, match=r"delegates\['t'\] must be a RunlogAgent"):
        PydanticRunlogAgent(PydanticAgent(TestModel(), name="a"), delegates={"t": object()})  # type: ignore[dict-item]


def test_delegate_outside_a_delegating_tool_is_refused() -> None:
    sub = PydanticRunlogAgent(PydanticAgent(TestModel(), name="sub"))
    other = PydanticRunlogAgent(PydanticAgent(TestModel(), name="other"))
    boss = PydanticAgent(TestModel(), name="boss")

    @boss.tool_plain
    async def ask(q: str) -> str:
        """Ask."""
        out: str = await other.delegate(q)  # named for another agent: refused
        return out

    durable = PydanticRunlogAgent(boss, delegates={"ask": sub})
    wf = Workflow("refused-delegate", "1")

    @wf.stage("s")
    async def s(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"out": (await durable.run(ctx, "go")).output}

    world = InMemoryWorld(App.of([wf, *durable.workflows()], durable.tools(), DictInputSource({})))
    with pytest.raises(WorkflowDefinitionError, match="delegate\\(\\) runs inside a tool"):
        world.run(wf, {})
    import asyncio

    with pytest.raises(WorkflowDefinitionError, match="delegate\\(\\) runs inside a tool"):
        asyncio.run(sub.delegate("hi"))
