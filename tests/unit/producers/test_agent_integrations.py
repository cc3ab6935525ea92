"""What every agent integration does, run against each (:mod:`runlog.producers.openai_agents`,
:mod:`runlog.producers.pydantic_ai`) on the in-memory adapters, with the same shop agent on each
framework's scripted model (no broker, no Redis, no network).

Each model call and each tool call is one recorded Runlog call; re-executing the stage with the
recorded calls calls neither the model nor the tools; an unrecorded turn after recorded ones is
asked of the model; a changed request at a recorded position, or a tool call recorded as another
tool, diverges and blocks the run; the declarations are checked. What is each framework's own is
tested in ``test_openai_agents*.py`` and ``test_pydantic_ai*.py``.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import pytest
from agents import Agent as OpenAIAgent
from agents import function_tool
from agents.testing import assistant_message
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import ModelResponse, TextPart
from pydantic_ai.models.function import FunctionModel

from runlog.producers import (
    CallInfo,
    ReplayPolicy,
    Tool,
    Workflow,
    load_args,
    openai_agents,
    pydantic_ai,
    tool,
)
from runlog.producers.calls._keys import canonical_json, sha256_hex
from runlog.projections import RunStatus
from runlog.projections.fold import fold_all
from runlog.schemas import Diverged, EventType
from runlog.schemas.errors import WorkflowDefinitionError
from tests.unit.producers import _openai_shop, _pydantic_shop
from tests.unit.producers._agent_world import World

T = EventType
PROMPT = {"prompt": "order sku-1 as o-1"}


class Shop(Protocol):
    """A shop agent on one framework: what its model and tools really did."""

    tools: list[str]
    rows: dict[str, dict[str, Any]]
    final: str
    fail_at_turn: int | None

    @property
    def model_turns(self) -> list[int]: ...

    def agent(self, **kw: Any) -> Any: ...


class Durable(Protocol):
    """What both integrations' ``RunlogAgent`` are (the core's ``DurableAgent``)."""

    model_tool: Tool
    _mapped: dict[str, Tool]

    def tool_for(self, agent_tool: str) -> Tool: ...

    def tools(self) -> list[Tool]: ...


@dataclass(frozen=True)
class Integration:
    """One agent integration, as these tests drive it."""

    name: str
    """Its module under ``runlog.producers`` and the prefix of its tools' names."""
    framework: str
    """The framework's top-level module."""
    extra: str
    """The extra that installs it (``pip install "runlog[<extra>]"``)."""
    shop: Callable[[], Shop]
    one_stage: Callable[[Any], Workflow]
    add_tool: Callable[[Any], None]
    """Give a durable agent's agent one more tool (the model's tool definitions change)."""
    bare: Callable[..., Durable]
    """``RunlogAgent`` of an agent named ``"a"`` answering ``"x"``, with the keywords given."""
    current_call: Callable[[], CallInfo]
    args_by_ref: set[str]
    """The model call's arguments stored by reference."""

    @property
    def model(self) -> str:
        return f"{self.name}.model.shop"

    @property
    def lookup(self) -> str:
        return f"{self.name}.tool.shop.lookup"


def _openai_add_tool(durable: openai_agents.RunlogAgent) -> None:
    @function_tool
    def extra() -> str:
        """A new tool: the model call's tool definitions differ."""
        return "x"

    durable.agent.tools.append(extra)


def _openai_bare(**kw: Any) -> openai_agents.RunlogAgent:
    model = _openai_shop.ScriptModel(lambda turn, input: [assistant_message("x")])
    return openai_agents.RunlogAgent(OpenAIAgent(name="a", model=model), **kw)


def _pydantic_add_tool(durable: pydantic_ai.RunlogAgent[None, str]) -> None:
    @durable.agent.tool_plain  # type: ignore[attr-defined]
    def extra() -> str:
        return "new tool: the model request's tool definitions differ"


def _pydantic_bare(**kw: Any) -> pydantic_ai.RunlogAgent[None, str]:
    agent = PydanticAgent(FunctionModel(lambda m, i: ModelResponse(parts=[TextPart("x")])), name="a")
    return pydantic_ai.RunlogAgent(agent, **kw)


INTEGRATIONS = [
    Integration("openai_agents", "agents", "openai-agents", _openai_shop.Shop, _openai_shop.one_stage,
                _openai_add_tool, _openai_bare, openai_agents.current_call, {"input", "tools"}),
    Integration("pydantic_ai", "pydantic_ai", "pydantic-ai", _pydantic_shop.Shop, _pydantic_shop.one_stage,
                _pydantic_add_tool, _pydantic_bare, pydantic_ai.current_call, {"messages", "parameters"}),
]


@pytest.fixture(params=INTEGRATIONS, ids=lambda i: i.name)
def integration(request: pytest.FixtureRequest) -> Integration:
    found: Integration = request.param
    return found


def test_each_model_call_and_tool_call_is_one_recorded_call(integration: Integration, world: World) -> None:
    shop = integration.shop()
    res = world.runner.run(integration.one_stage(shop.agent()), PROMPT)
    assert res.completed and res.outputs == {"order": {"answer": "saved row-o-1 for 1200"}}
    assert shop.model_turns == [0, 1, 2] and shop.tools == ["lookup:sku-1", "save:o-1"]
    model, lookup, save = integration.model, integration.lookup, "orders.save"
    evs = world.events(res.run_id)
    assert [e.call_id for e in evs if e.type is T.TOOL_CALLED] == [
        f"order/{model}/0", f"order/{lookup}/1", f"order/{model}/2", f"order/{save}/3", f"order/{model}/4"]
    policies = {e.tool: e.replay_policy for e in evs if e.type is T.TOOL_CALLED}
    assert policies == {model: ReplayPolicy.SAFE, lookup: ReplayPolicy.SAFE, save: ReplayPolicy.IDEMPOTENT}
    [intent] = [e for e in evs if e.type is T.EFFECT_INTENT]
    assert intent.call_id == f"order/{save}/3" and intent.target == "db:orders"
    [effect] = [e for e in evs if e.type is T.EFFECT_RESULT]
    assert effect.external_id == "row-o-1" and effect.delivery_key in shop.rows
    done = world.ledger.lookup(effect.delivery_key or "")
    assert done is not None and done.done and done.external_id == "row-o-1"
    state = fold_all(evs)
    assert state is not None and state.status is RunStatus.COMPLETED and state.rejected_total == 0
    # a model call's long arguments by reference (stored once), the request hash over the whole request
    called = [e for e in evs if e.type is T.TOOL_CALLED and e.tool == model]
    assert called[1].payload_ref is not None
    stored = json.loads(world.store.get(called[1].payload_ref))
    assert set(stored["refs"]) == integration.args_by_ref and not set(stored["args"]) & set(stored["refs"])
    args = load_args(world.store, called[1].payload_ref)
    assert sha256_hex(canonical_json(args)) == called[1].request_hash
    assert set(args) == set(stored["args"]) | integration.args_by_ref


def test_re_executing_with_the_recorded_calls_calls_neither_model_nor_tools(
        integration: Integration, world: World) -> None:
    shop = integration.shop()
    wf = integration.one_stage(shop.agent())
    first = world.runner.run(wf, PROMPT)
    n = len(world.events(first.run_id))
    res = world.again(first.run_id, wf, PROMPT, recorded_calls=world.recorded(first.run_id))
    assert res.completed and res.epoch == 2 and res.outputs == first.outputs
    assert shop.model_turns == [0, 1, 2] and shop.tools == ["lookup:sku-1", "save:o-1"]  # nothing again
    tail = world.events(first.run_id)[n:]
    assert [e.type for e in tail] == [T.LEASE_ACQUIRED, T.STAGE_STARTED, T.VERIFIED, T.RUN_COMPLETED]
    assert all(e.usage is None for e in tail)  # a replay spends nothing


def test_an_unrecorded_turn_after_recorded_ones_is_asked_of_the_model(
        integration: Integration, world: World) -> None:
    shop = integration.shop()
    shop.fail_at_turn = 2  # the first run dies at its last model call
    wf = integration.one_stage(shop.agent())
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


def test_a_changed_prompt_at_a_recorded_position_diverges_and_blocks_the_run(
        integration: Integration, world: World) -> None:
    shop = integration.shop()
    wf = integration.one_stage(shop.agent())
    first = world.runner.run(wf, PROMPT)
    n = len(world.events(first.run_id))
    with pytest.raises(Diverged) as info:
        world.again(first.run_id, wf, {"prompt": "order sku-2 as o-2"},
                    recorded_calls=world.recorded(first.run_id))
    assert info.value.call_id == f"order/{integration.model}/0"
    assert shop.model_turns == [0, 1, 2] and shop.tools == ["lookup:sku-1", "save:o-1"]
    tail = world.events(first.run_id)[n:]
    assert [e.type for e in tail] == [T.LEASE_ACQUIRED, T.STAGE_STARTED, T.CALL_DIVERGED, T.RUN_BLOCKED]
    state = fold_all(world.events(first.run_id))
    assert state is not None and state.status is RunStatus.BLOCKED
    blocked = tail[-1].error  # the reason a person reads: the call, and that it diverged
    assert blocked is not None and f"order/{integration.model}/0" in blocked.message
    assert "diverged" in blocked.message


def test_another_tool_set_at_a_recorded_position_diverges(integration: Integration, world: World) -> None:
    shop = integration.shop()
    durable = shop.agent()
    first = world.runner.run(integration.one_stage(durable), PROMPT)
    integration.add_tool(durable)
    with pytest.raises(Diverged) as info:
        world.again(first.run_id, integration.one_stage(durable), PROMPT,
                    recorded_calls=world.recorded(first.run_id))
    assert info.value.call_id == f"order/{integration.model}/0"


def test_a_tool_call_recorded_as_another_tool_diverges(integration: Integration, world: World) -> None:
    """An agent tool mapped to another Runlog tool than the one its recorded call was made as."""
    shop = integration.shop()
    first = world.runner.run(integration.one_stage(shop.agent()), PROMPT)
    renamed = shop.agent(tools_policy=ReplayPolicy.IDEMPOTENT)  # the lookup is recorded as another call
    renamed._mapped["lookup"] = tool("catalog.lookup", policy=ReplayPolicy.SAFE)(lambda call, **a: None)
    with pytest.raises(Diverged) as info:
        world.again(first.run_id, integration.one_stage(renamed), PROMPT,
                    recorded_calls=world.recorded(first.run_id))
    assert info.value.call_id == f"order/{integration.lookup}/1"
    state = fold_all(world.events(first.run_id))
    assert state is not None and state.status is RunStatus.BLOCKED


def test_the_async_runner_runs_a_durable_agent(integration: Integration, world: World) -> None:
    shop = integration.shop()
    wf = integration.one_stage(shop.agent())

    async def main() -> Any:
        runner = world.async_runner()
        try:
            return await runner.run(wf, PROMPT)
        finally:
            await runner.aclose()

    res = asyncio.run(main())
    assert res.completed and res.outputs == {"order": {"answer": "saved row-o-1 for 1200"}}
    assert world.called(res.run_id) == [integration.model, integration.lookup, integration.model,
                                        "orders.save", integration.model]


def test_declarations_are_checked(integration: Integration) -> None:
    with pytest.raises(WorkflowDefinitionError, match="needs a name without '/'"):
        integration.bare(name="a/b")
    with pytest.raises(WorkflowDefinitionError, match="tools_policy must be SAFE or IDEMPOTENT"):
        integration.bare(tools_policy=ReplayPolicy.NEVER)
    with pytest.raises(WorkflowDefinitionError, match="model_policy must be SAFE or IDEMPOTENT"):
        integration.bare(model_policy=ReplayPolicy.RECONCILE_FIRST)
    with pytest.raises(WorkflowDefinitionError, match=r"tools\['x'\] must be a Runlog Tool, got str"):
        integration.bare(tools={"x": "not a tool"})
    durable = integration.bare(model_policy=ReplayPolicy.IDEMPOTENT)
    assert durable.model_tool.name == f"{integration.name}.model.a"
    assert durable.model_tool.policy is ReplayPolicy.IDEMPOTENT
    auto = durable.tool_for("t")
    assert auto.name == f"{integration.name}.tool.a.t" and auto.policy is ReplayPolicy.SAFE
    assert durable.tool_for("t") is auto and durable.tools() == [durable.model_tool]
    mapped = tool("orders.save", policy=ReplayPolicy.IDEMPOTENT)(lambda call, **a: None)
    declared = integration.bare(tools={"save": mapped})
    assert declared.tool_for("save") is mapped and declared.tools() == [declared.model_tool, mapped]
    with pytest.raises(RuntimeError, match="only available inside a tool call"):
        integration.current_call()


def test_importing_without_the_framework_names_the_extra(
        integration: Integration, monkeypatch: pytest.MonkeyPatch) -> None:
    module = f"runlog.producers.{integration.name}"
    monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, integration.framework, None)  # type: ignore[arg-type]
    with pytest.raises(ImportError, match=rf'pip install "runlog\[{integration.extra}\]"'):
        importlib.import_module(module)
