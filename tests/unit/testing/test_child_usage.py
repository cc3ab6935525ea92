"""What child runs spend rolls up to their parent, durably: the event recording a child's outcome on
the parent's log carries the child's spend (``runlog.usage.child``), the parent's state keeps it apart
from its own and counts it in its totals once (a re-run of the stage, a second fold or a duplicate
event adds nothing), and a budget on the parent counts it: the parent's next model call past the cap
is not made."""

from __future__ import annotations

import json
from typing import Any

from runlog import App, Budget, CallInfo, DictInputSource, ReplayPolicy, StageContext, Workflow, tool
from runlog.processors.inspect import usage_doc, usage_lines
from runlog.processors.inspect.children import child_tree
from runlog.projections import RunState, RunStatus
from runlog.projections.fold import fold_all
from runlog.projections.internal import CHILD_USAGE_ATTRIBUTE, UsageTotals
from runlog.schemas import EventType, Usage
from runlog.testing import InMemoryWorld


@tool("model", policy=ReplayPolicy.SAFE, usage=lambda r: Usage("m", input_tokens=100, output_tokens=10))
def model(call: CallInfo, q: str) -> dict[str, Any]:
    return {"answer": q.upper()}


worker = Workflow("worker", version="1")


@worker.stage("work")
def work(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
    return {"a": ctx.call(model, q="one")["answer"] + ctx.call(model, q="two")["answer"]}


def _boss(name: str, budget: Budget | None) -> Workflow:
    wf = Workflow(name, version="1", budget=budget)

    @wf.stage("lead")
    def lead(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        ctx.call(model, q="plan")
        done = ctx.start_child(worker, {}).result()
        return {"a": done.outputs["work"]["a"], "b": ctx.call(model, q="sum")["answer"]}

    return wf


boss = _boss("boss", None)
capped = _boss("capped", Budget(tokens=300, on_exceeded="fail"))
APP = App.of([boss, capped, worker], [model], DictInputSource({}))
CALL = UsageTotals(1, 100, 10, unpriced_calls=1)


def test_a_childs_spend_is_recorded_once_on_its_parents_log_and_counted_apart_from_its_own() -> None:
    world = InMemoryWorld(APP)
    first = world.run(boss, {})
    assert first.waiting == "runlog.child"
    world.serve()
    state = world.state(first.run_id)
    assert state is not None and state.status is RunStatus.COMPLETED
    [child_id] = state.children
    child = world.state(child_id)
    assert child is not None and child.total_usage == CALL.plus(CALL)
    # the parent's own calls (plan, sum) and its child's two, the child's once
    assert state.usage == CALL.plus(CALL)
    assert state.children_usage == {child_id: CALL.plus(CALL)}
    assert state.total_usage == UsageTotals(4, 400, 40, unpriced_calls=4)
    carried = [e for e in world.events(first.run_id) if CHILD_USAGE_ATTRIBUTE in e.attributes]
    assert len(carried) == 1 and carried[0].attributes["runlog.child_run_id"] == child_id
    assert json.loads(carried[0].attributes[CHILD_USAGE_ATTRIBUTE])["input_tokens"] == 200
    # the same totals from a fold of the log, from the state's JSON, and with the event delivered twice
    events = world.events(first.run_id)
    folded = fold_all(events)
    assert folded is not None and folded.children_usage == state.children_usage
    assert RunState.from_json(state.to_json()).children_usage == state.children_usage
    at = events.index(carried[0]) + 1
    again = fold_all([*events[:at], carried[0], *events[at:]])
    assert again is not None and again.total_usage == state.total_usage
    # what operators read: own and children apart; the tree adds nothing recorded already
    doc = usage_doc(state)
    assert doc["own"]["calls"] == 2 and doc["children"]["calls"] == 2 and doc["total"]["calls"] == 4
    lines = usage_lines(state)
    assert "    own: 200 in / 20 out over 2 calls, 2 without a price" in lines
    assert ("    children (1 ended, recorded with their outcomes): 200 in / 20 out over 2 calls, "
            "2 without a price") in lines
    tree = child_tree(state, world.state)
    assert tree.with_children == state.total_usage


def test_a_budget_on_the_parent_counts_its_childrens_spend() -> None:
    world = InMemoryWorld(APP)
    first = world.run(capped, {})  # plan: 110 tokens, under the cap of 300
    assert first.waiting == "runlog.child"
    world.serve()  # the child spends 220: with it the parent is at 330, past its cap
    state = world.state(first.run_id)
    assert state is not None
    assert state.status is RunStatus.FAILED, state.status
    assert state.last_error is not None and state.last_error.kind == "BudgetExceeded"
    assert [e.call_id for e in world.events(first.run_id) if e.type is EventType.TOOL_CALLED
            and e.tool == "model"] == ["lead/model/0"]  # "sum" was not asked
    assert world.executions(first.run_id)["model"] == 1
