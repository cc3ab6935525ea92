"""Usage recorded once: a model call's tokens and cost ride on its ``TOOL_RESULT``, priced by the
App's price table, and the fold's totals count each recorded call once (in-memory adapters, Pydantic
AI's ``FunctionModel``: no broker, no Redis, no network)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

from runlog.producers import App, AsyncStageContext, DictInputSource, Price, PriceTable, Tool, Workflow, tool
from runlog.producers.define._prices import check_usage
from runlog.producers.pydantic_ai import RunlogAgent
from runlog.projections._usage import INHERITED_ATTRIBUTE, UsageTotals
from runlog.projections.fold import fold, fold_all
from runlog.schemas import EventType, RunEvent, Usage, WorkflowDefinitionError
from tests.unit.producers._replay import MemoryWorld

T = EventType
PRICES = {"m-priced": Price(input="2.50", output=10, cache_read="0.25")}


def usage_of_turn(turn: int) -> RequestUsage:
    return RequestUsage(input_tokens=1000 + 100 * turn, output_tokens=50 + turn, cache_read_tokens=400)


class Model:
    """A FunctionModel: ``turns`` lookups (one tool call per turn), then an answer; every response
    says what it used; fails at turn ``fail_at`` when set."""

    def __init__(self, turns: int = 3, fail_at: int | None = None) -> None:
        self.turns, self.fail_at, self.asked = turns, fail_at, 0

    def respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        self.asked += 1
        if turn == self.fail_at:
            raise RuntimeError(f"crashed at model call {turn + 1}")
        done = sum(isinstance(p, ToolReturnPart) for m in messages for p in m.parts)
        part = ToolCallPart("lookup", {"n": done}) if done < self.turns else TextPart(f"looked {done} up")
        return ModelResponse(parts=[part], usage=usage_of_turn(turn))


def workflow(model: Model, name: str) -> Workflow:
    agent = Agent(FunctionModel(model.respond, model_name=name), name="shop")

    @agent.tool_plain
    def lookup(n: int) -> int:
        return n * 2

    durable = RunlogAgent(agent)
    wf = Workflow("usage", "1")

    @wf.stage("ask")
    async def ask(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"answer": (await durable.run(ctx, "look things up")).output}

    return wf


@pytest.fixture
def world() -> Iterator[MemoryWorld]:
    w = MemoryWorld(prices=PRICES)
    yield w
    w.runner.close()


def expected(turns: int, model: str, prices: PriceTable) -> UsageTotals:
    total = UsageTotals()
    for t in range(turns):
        u = usage_of_turn(t)
        total = total.add(prices.priced(Usage(model, u.input_tokens, u.output_tokens, u.cache_read_tokens)))
    return total


def test_each_model_result_records_its_tokens_and_the_price_tables_cost(world: MemoryWorld) -> None:
    res = world.runner.run(workflow(Model(), "m-priced"), {})
    assert res.completed
    results = [e for e in world.events(res.run_id) if e.type is T.TOOL_RESULT]
    model_results = [e for e in results if e.tool == "pydantic_ai.model.shop"]
    assert [e.usage is None for e in results if e.tool != "pydantic_ai.model.shop"] == [True] * 3
    # (1000 - 400) * 2.50 + 400 * 0.25 + 50 * 10 dollars per million tokens, in billionths
    assert model_results[0].usage == Usage("function:m-priced", 1000, 50, 400, 0, 2_100_000)
    assert [e.usage.input_tokens for e in model_results if e.usage] == [1000, 1100, 1200, 1300]
    state = fold_all(world.events(res.run_id))
    assert state is not None
    assert state.usage == expected(4, "function:m-priced", PriceTable(PRICES))
    assert state.usage.calls == 4 and state.usage.unpriced_calls == 0
    assert state.stage_usage == {"ask": state.usage}
    assert state.model_usage == {"function:m-priced": state.usage}


def test_a_model_without_a_price_records_tokens_and_no_cost(world: MemoryWorld) -> None:
    res = world.runner.run(workflow(Model(turns=1), "m-free"), {})
    state = fold_all(world.events(res.run_id))
    assert state is not None
    assert state.usage.calls == 2 and state.usage.input_tokens == 2100 and state.usage.output_tokens == 101
    assert state.usage.cost_nanos is None and state.usage.unpriced_calls == 2
    assert "without a price" in state.usage.describe()


def test_a_resume_after_the_third_model_call_counts_the_same_totals(world: MemoryWorld) -> None:
    whole = world.runner.run(workflow(Model(), "m-priced"), {})
    uncrashed = fold_all(world.events(whole.run_id))
    crashing = Model(fail_at=3)  # the fourth request fails: three model calls are recorded
    wf = workflow(crashing, "m-priced")
    with pytest.raises(RuntimeError, match="crashed at model call 4"):
        world.runner.run(wf, {})
    run_id = next(r for r in world.log.run_ids() if r != whole.run_id)
    assert fold_all(world.events(run_id)).usage.calls == 3  # type: ignore[union-attr]
    crashing.fail_at = None
    res = world.again(run_id, wf, {}, recorded_calls=world.recorded(run_id))
    assert res.completed and crashing.asked == 5  # 3 + the failed one, then only the 4th again
    resumed = fold_all(world.events(run_id))
    assert resumed is not None and uncrashed is not None
    assert resumed.usage == uncrashed.usage and resumed.stage_usage == uncrashed.stage_usage
    # replaying the whole log again (a redelivery of every event) adds nothing
    again = resumed
    for e in world.events(run_id):
        again, out = fold(again, e)
        assert not out.accepted
    assert again.usage == uncrashed.usage


def test_a_branch_starts_from_its_parents_totals_kept_apart() -> None:
    parent = UsageTotals().add(Usage("a:m", 10, 5, cost_nanos=7)).add(Usage("a:m", 20, 1))
    events = [RunEvent("b", 1, 1, T.RUN_STARTED, 1, parent_run_id="p", forked_from_seq=9),
              RunEvent("b", 2, 1, T.RUN_BRANCHED, 2, parent_run_id="p", forked_from_seq=9,
                       attributes={INHERITED_ATTRIBUTE: parent.to_json()}),
              RunEvent("b", 3, 1, T.TOOL_RESULT, 3, stage="s", call_id="s/t/0",
                       usage=Usage("a:m", 1, 2, cost_nanos=3))]
    s = fold_all(events)
    assert s is not None and s.inherited_usage == parent
    assert s.usage == UsageTotals(1, 1, 2, 0, 0, 3, 0)
    assert s.total_usage == UsageTotals(3, 31, 8, 0, 0, 10, 1)
    assert s.from_json(s.to_json()) == s
    bad = [events[0], RunEvent("b", 2, 1, T.RUN_BRANCHED, 2, attributes={INHERITED_ATTRIBUTE: "{"})]
    assert fold_all(bad).inherited_usage is None  # type: ignore[union-attr]


def test_the_app_declares_prices_and_a_bad_one_is_refused() -> None:
    app = App.of([], [], DictInputSource({}), prices=PRICES)
    assert app.prices.price_of("function:m-priced") == PRICES["m-priced"]
    assert app.prices.price_of("function:other") is None
    assert App.of([], [], DictInputSource({})).prices == PriceTable()
    table = PriceTable({"openai:gpt": Price(1, 2, cache_write=3)})
    assert table.cost_nanos(Usage("openai:gpt", 100, 10, 0, 50)) == 50 * 1000 + 10 * 2000 + 50 * 3000
    assert table.cost_nanos(Usage("other:gpt", 100, 10)) is None  # only "gpt" alone would match it
    for bad in (Price(-1, 1), Price("x", 1), Price(1, float("inf")), Price(True, 1)):
        with pytest.raises(WorkflowDefinitionError, match="finite number"):
            PriceTable({"m": bad})
    with pytest.raises(WorkflowDefinitionError, match="input and output are required"):
        PriceTable({"m": Price(None, 1)})  # type: ignore[arg-type]
    with pytest.raises(WorkflowDefinitionError, match="must be a Price"):
        PriceTable({"m": (1, 2)})  # type: ignore[dict-item]
    with pytest.raises(WorkflowDefinitionError, match="token counts"):
        check_usage(Usage("m", -1), "tool 't'")
    with pytest.raises(WorkflowDefinitionError, match="must be a runlog Usage"):
        check_usage({"input_tokens": 1}, "tool 't'")


def test_any_tool_may_report_usage_and_a_bad_report_fails_the_call() -> None:
    w = MemoryWorld(prices={"x:y": Price(1, 1)})
    try:
        ok = tool("llm.call", usage=lambda r: Usage("x:y", r["in"], r["out"]))(
            lambda call, **_: {"in": 3, "out": 4})
        broken = Tool("llm.bad", lambda call, **_: {"in": "3"}, ok.policy,
                      usage=lambda r: Usage("x:y", r["in"]))
        wf = Workflow("plain", "1")

        @wf.stage("s")
        def s(ctx: Any, inputs: Any) -> dict[str, Any]:
            ctx.call(ok)
            ctx.call(broken)
            return {}

        with pytest.raises(WorkflowDefinitionError, match="token counts"):
            w.runner.run(wf, {})
        [run_id] = w.log.run_ids()
        [result] = [e for e in w.events(run_id) if e.type is T.TOOL_RESULT]
        assert result.usage == Usage("x:y", 3, 4, cost_nanos=7000)
        [failed] = [e for e in w.events(run_id) if e.type is T.FAILED and e.call_id]
        assert failed.tool == "llm.bad"
    finally:
        w.runner.close()
