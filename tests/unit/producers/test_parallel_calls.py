"""Concurrent calls of one async stage keep the positions their code gives them, never the order they
finish: ``asyncio.gather`` over ``ctx.call`` (a call's position is taken when ``ctx.call`` is
invoked), positions reserved ahead (``ctx.reserve``) for calls made later in concurrent branches, and
the tool calls of one Pydantic AI model response (positions in the response's order, the calls run
concurrently). A re-run whose calls finish in another order is the same run to the determinism
guard; another call set still diverges. On the in-memory adapters (no broker, no Redis).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults, RunContext, ToolDefinition
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from runlog.producers import (
    AsyncStageContext,
    CallInfo,
    Diverged,
    ReplayPolicy,
    Tool,
    Workflow,
    WorkflowDefinitionError,
    tool,
)
from runlog.producers.calls._calls import RecordedCall
from runlog.producers.pydantic_ai import RunlogAgent
from runlog.schemas import EventType, RunEvent
from tests.unit.producers._replay import MemoryWorld, again_async

T = EventType


def arun(fn: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    return asyncio.run(fn())


class World(MemoryWorld):
    """The in-memory adapters, an AsyncRunner, and a ``work`` tool whose duration the test sets
    per argument (so the test decides which call finishes first)."""

    def __init__(self) -> None:
        super().__init__()
        self.aio = self.async_runner()
        self.delays: dict[str, float] = {}
        self.done: list[str] = []

        @tool("work")
        async def work(call: CallInfo, x: str) -> dict[str, Any]:
            await asyncio.sleep(self.delays.get(x, 0.0))
            self.done.append(x)
            return {"x": x, "at": call.index}

        self.work = work

    def called(self, run_id: str) -> list[tuple[str | None, str | None]]:
        """``(call_id, x)`` of every TOOL_CALLED, in log order."""
        return [(e.call_id, e.tool) for e in self.events(run_id) if e.type is T.TOOL_CALLED]

    def results(self, run_id: str) -> list[str | None]:
        return [e.call_id for e in self.events(run_id) if e.type is T.TOOL_RESULT]

    def rerun(self, run_id: str, wf: Workflow, recorded: dict[str, RecordedCall]) -> Any:
        return arun(lambda: again_async(self.aio, self.events(run_id), wf, {}, recorded_calls=recorded))


@pytest.fixture
def world() -> Iterator[World]:
    w = World()
    yield w
    w.runner.close()


def _partial(recorded: dict[str, RecordedCall], finished: set[str],
             started: set[str]) -> dict[str, RecordedCall]:
    """The calls a crash left in the log: ``finished`` with their results, ``started`` without."""
    out = {}
    for cid, r in recorded.items():
        if cid in finished:
            out[cid] = r
        elif cid in started:
            out[cid] = RecordedCall(r.call_id, r.tool, r.request_hash)
    return out


def gather_workflow(w: World, xs: list[str], swap_awaits: bool = False) -> Workflow:
    wf = Workflow("gather", "1")

    @wf.stage("fan")
    async def fan(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        calls = [ctx.call(w.work, x=x) for x in xs]  # each call's position is taken here
        if swap_awaits:  # awaited in another order than invoked: the positions stay
            calls.reverse()
        out = await asyncio.gather(*calls)
        return {"at": {r["x"]: r["at"] for r in out}}

    return wf


def test_gathered_calls_take_positions_in_invocation_order_not_completion_order(world: World) -> None:
    world.delays = {"a": 0.15, "b": 0.0, "c": 0.08}  # they finish b, c, a
    wf = gather_workflow(world, ["a", "b", "c"], swap_awaits=True)
    first = arun(lambda: world.aio.run(wf, {}))
    assert first.completed and first.outputs["fan"]["at"] == {"a": 0, "b": 1, "c": 2}
    assert world.done == ["b", "c", "a"]
    # started in await order (c, b, a), finished b, c, a: the positions are the invocation order
    assert [cid for cid, _ in world.called(first.run_id)] == ["fan/work/2", "fan/work/1", "fan/work/0"]
    assert world.results(first.run_id) == ["fan/work/1", "fan/work/2", "fan/work/0"]


def test_a_resume_whose_gathered_calls_finish_in_another_order_is_accepted(world: World) -> None:
    world.delays = {"a": 0.15, "b": 0.0, "c": 0.08}
    wf = gather_workflow(world, ["a", "b", "c"])
    first = arun(lambda: world.aio.run(wf, {}))
    assert world.results(first.run_id) == ["fan/work/1", "fan/work/2", "fan/work/0"]
    # a crash in the middle of the step: b finished, a was started, c not yet; the resume's calls
    # finish the other way round (a before c)
    recorded = _partial(world.recorded(first.run_id), finished={"fan/work/1"}, started={"fan/work/0"})
    world.delays, world.done = {"a": 0.0, "b": 0.0, "c": 0.15}, []
    again = world.rerun(first.run_id, wf, recorded)
    assert again.completed and again.outputs == first.outputs
    assert world.done == ["a", "c"]  # b's recorded result is reused, the others run again
    types = [e.type for e in world.events(first.run_id)]
    assert T.CALL_DIVERGED not in types and types[-1] is T.RUN_COMPLETED


def test_a_genuinely_different_call_set_still_diverges(world: World) -> None:
    wf = gather_workflow(world, ["a", "b", "c"])
    first = arun(lambda: world.aio.run(wf, {}))
    changed = gather_workflow(world, ["a", "x", "c"])
    world.done = []
    with pytest.raises(Diverged):
        world.rerun(first.run_id, changed, world.recorded(first.run_id))
    evs = world.events(first.run_id)
    [div] = [e for e in evs if e.type is T.CALL_DIVERGED]
    assert div.call_id == "fan/work/1" and evs[-1].type is T.RUN_BLOCKED
    assert "x" not in world.done


def chain_workflow(w: World, reserve: bool) -> Workflow:
    """Two concurrent branches, each a call and then a second call fed by the first one's result."""
    wf = Workflow("chains", "1")

    @wf.stage("fan")
    async def fan(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        async def branch(name: str) -> list[int]:
            if reserve:
                first, second = ctx.reserve(2)
                r1 = await first.call(w.work, x=f"{name}1")
                r2 = await second.call(w.work, x=f"{name}2-after-{r1['x']}")
            else:
                r1 = await ctx.call(w.work, x=f"{name}1")
                r2 = await ctx.call(w.work, x=f"{name}2-after-{r1['x']}")
            return [r1["at"], r2["at"]]

        p, q = await asyncio.gather(branch("p"), branch("q"))
        return {"p": p, "q": q}

    return wf


def test_reserved_positions_keep_chained_calls_in_place_whatever_finishes_first(world: World) -> None:
    wf = chain_workflow(world, reserve=True)
    world.delays = {"p1": 0.12, "q1": 0.0}
    first = arun(lambda: world.aio.run(wf, {}))
    assert first.outputs["fan"] == {"p": [0, 1], "q": [2, 3]}
    # resumed with p's second call not yet made and the first calls finishing the other way round
    recorded = _partial(world.recorded(first.run_id), finished={"fan/work/0", "fan/work/2", "fan/work/3"},
                        started=set())
    world.delays, world.done = {"p2-after-p1": 0.1}, []
    again = world.rerun(first.run_id, wf, recorded)
    assert again.completed and again.outputs == first.outputs and world.done == ["p2-after-p1"]
    assert T.CALL_DIVERGED not in [e.type for e in world.events(first.run_id)]


def test_unreserved_chains_take_positions_as_their_first_calls_finish(world: World) -> None:
    """Why ``reserve`` exists: a call invoked after an await in a concurrent branch gets the next
    free position at that moment, so another finishing order is another call set."""
    wf = chain_workflow(world, reserve=False)
    world.delays = {"p1": 0.12, "q1": 0.0}
    first = arun(lambda: world.aio.run(wf, {}))
    assert first.outputs["fan"] == {"p": [0, 3], "q": [1, 2]}
    world.delays = {"p1": 0.0, "q1": 0.12}
    with pytest.raises(Diverged):
        world.rerun(first.run_id, wf, _partial(world.recorded(first.run_id), set(), {"fan/work/2"}))


def test_a_position_is_used_once_and_reserve_needs_a_count(world: World) -> None:
    wf = Workflow("misuse", "1")
    seen: list[str] = []

    @wf.stage("s")
    async def s(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        [pos] = ctx.reserve(1)
        await pos.call(world.work, x="once")
        with pytest.raises(WorkflowDefinitionError, match="used already"):
            pos.call(world.work, x="twice")
        for bad in (0, -1, True, 1.5):
            with pytest.raises(WorkflowDefinitionError, match="positive number"):
                ctx.reserve(bad)  # type: ignore[arg-type]
        seen.append(repr(pos))
        return {}

    res = arun(lambda: world.aio.run(wf, {}))
    assert res.completed and seen == ["CallPosition('s', 0)"] and world.done == ["once"]


# -- the tool calls of one Pydantic AI model response ---------------------------------------------

MODEL = "pydantic_ai.model.par"
TOOL = "pydantic_ai.tool.par"


@dataclasses.dataclass
class Gate(AbstractCapability[Any]):
    """A capability that holds each tool call back before it runs (a rate limiter, an audit write):
    the calls reach their toolset in another order than the model gave them."""

    hold: dict[str, float]

    async def before_tool_execute(self, ctx: RunContext[Any], *, call: ToolCallPart, tool_def: ToolDefinition,
                                  args: Any) -> Any:
        await asyncio.sleep(self.hold.get(call.tool_name, 0.0))
        return args


class Agentic:
    """An agent whose first response asks for three tools at once, then answers with their results.

    ``delays``: each tool's duration; ``hold``: how long a capability holds a call back before it
    reaches the toolset; ``args``: the model's arguments for a tool (default ``{"q": name}``);
    ``sequential``: tools declared ``sequential=True``; ``fail``: tools that raise; ``effect``: a
    tool mapped to an effect Runlog tool (its rows in ``rows``)."""

    def __init__(self, delays: dict[str, float], hold: dict[str, float] | None = None, *,
                 args: dict[str, dict[str, Any]] | None = None, sequential: frozenset[str] = frozenset(),
                 fail: frozenset[str] = frozenset(), effect: str | None = None) -> None:
        self.delays = delays
        self.hold = hold or {}
        self.args = args or {}
        self.sequential, self.fail, self.effect = sequential, fail, effect
        self.ran: list[str] = []
        self.spans: dict[str, tuple[float, float]] = {}
        """Each tool's (start, end) on the monotonic clock: which ran at the same time as which."""
        self.rows: list[str] = []
        self.turns: list[int] = []

    def respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        self.turns.append(turn)
        if turn == 0:
            return ModelResponse(parts=[ToolCallPart(n, self.args.get(n, {"q": n}), tool_call_id=f"c{i}")
                                        for i, n in enumerate(["slow", "fast", "mid"])])
        got = [p.content for m in messages for p in m.parts
               if isinstance(p, ToolReturnPart) and p.outcome == "success"]
        return ModelResponse(parts=[TextPart(" ".join(str(g) for g in got))])

    def durable(self) -> RunlogAgent[None, str]:
        agent = Agent(FunctionModel(self.respond), name="par", capabilities=[Gate(self.hold)])
        mapped: dict[str, Tool] = {}
        for name in ("slow", "fast", "mid"):
            fn = self._tool(name)
            agent.tool_plain(name=name, sequential=name in self.sequential)(fn)
            if name == self.effect:
                mapped[name] = tool(f"rows.{name}", policy=ReplayPolicy.IDEMPOTENT, effect=True,
                                    target="memory:rows",
                                    delivery=lambda a, c: ("acct", "rows", a["q"], "1"))(fn)
        return RunlogAgent(agent, tools=mapped)

    def _tool(self, name: str) -> Callable[[str], Coroutine[Any, Any, Any]]:
        async def fn(q: str) -> Any:
            start = time.monotonic()
            await asyncio.sleep(self.delays[name])
            self.spans[name] = (start, time.monotonic())
            if name in self.fail:
                raise ValueError(f"{name} broke")
            self.ran.append(name)
            if name == self.effect:
                self.rows.append(q)
                return {"external_id": f"row-{q}"}
            return f"{name}:{q}"
        return fn


def agent_workflow(durable: RunlogAgent[None, str]) -> Workflow:
    wf = Workflow("par", "1")

    @wf.stage("ask")
    async def ask(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"answer": (await durable.run(ctx, "go")).output}

    return wf


def _tool_called(evs: list[RunEvent]) -> list[str | None]:
    return [e.call_id for e in evs if e.type is T.TOOL_CALLED and e.tool != MODEL]


def test_the_tool_calls_of_one_response_run_concurrently_in_response_positions(world: World) -> None:
    # the calls reach the toolset as fast, mid, slow (held back 0, 0.02, 0.05 s)
    shop = Agentic({"slow": 0.4, "fast": 0.4, "mid": 0.4}, hold={"slow": 0.05, "mid": 0.02})
    wf = agent_workflow(shop.durable())
    res = arun(lambda: world.aio.run(wf, {}))
    assert res.completed and res.outputs["ask"]["answer"] == "slow:slow fast:fast mid:mid"
    # all three at once: the last to start started before the first to end ended
    starts, ends = zip(*shop.spans.values(), strict=True)
    assert len(starts) == 3 and max(starts) < min(ends), shop.spans
    # appended as the calls arrived (fast, mid, slow), at the positions of the response's order
    assert _tool_called(world.events(res.run_id)) == [
        f"ask/{TOOL}.fast/2", f"ask/{TOOL}.mid/3", f"ask/{TOOL}.slow/1"]


def test_a_resumed_response_whose_tools_finish_in_another_order_is_accepted(world: World) -> None:
    shop = Agentic({"slow": 0.2, "fast": 0.0, "mid": 0.1})
    wf = agent_workflow(shop.durable())
    first = arun(lambda: world.aio.run(wf, {}))
    evs = world.events(first.run_id)
    assert [e.call_id for e in evs if e.type is T.TOOL_RESULT and e.tool != MODEL] == [
        f"ask/{TOOL}.fast/2", f"ask/{TOOL}.mid/3", f"ask/{TOOL}.slow/1"]
    # the crash came when fast had finished, slow was running and mid had not started; the resume's
    # tools reach the toolset and finish in another order, and the model's first answer is read back
    recorded = _partial(world.recorded(first.run_id),
                        finished={f"ask/{MODEL}/0", f"ask/{TOOL}.fast/2"}, started={f"ask/{TOOL}.slow/1"})
    again_shop = Agentic({"slow": 0.0, "fast": 0.0, "mid": 0.2}, hold={"slow": 0.1})
    again = world.rerun(first.run_id, agent_workflow(again_shop.durable()), recorded)
    assert again.completed and again.outputs == first.outputs
    assert again_shop.ran == ["slow", "mid"] and again_shop.turns == [1]  # fast and turn 0 read back
    assert T.CALL_DIVERGED not in [e.type for e in world.events(first.run_id)]


def test_a_failing_tool_never_cancels_a_sibling_effect_in_flight(world: World) -> None:
    shop = Agentic({"slow": 0.2, "fast": 0.0, "mid": 0.0}, fail=frozenset({"fast"}), effect="slow")
    with pytest.raises(ValueError, match="fast broke"):
        arun(lambda: world.aio.run(agent_workflow(shop.durable()), {}))
    [run_id] = world.log.run_ids()
    evs = world.events(run_id)
    done = [(e.type, e.call_id) for e in evs if e.type in (T.EFFECT_RESULT, T.TOOL_RESULT, T.FAILED)]
    assert (T.FAILED, f"ask/{TOOL}.fast/2") in done  # the failure is recorded ...
    assert (T.EFFECT_RESULT, "ask/rows.slow/1") in done and (T.TOOL_RESULT, "ask/rows.slow/1") in done
    assert shop.rows == ["slow"]  # ... and the effect that was under way finished and was recorded
    assert T.VERIFIED not in [e.type for e in evs]


def test_a_call_the_agent_does_not_make_leaves_its_position_empty(world: World) -> None:
    shop = Agentic({"slow": 0.0, "fast": 0.0, "mid": 0.0}, args={"fast": {"wrong": 1}})  # fails validation
    wf = agent_workflow(shop.durable())
    first = arun(lambda: world.aio.run(wf, {}))
    assert first.completed and first.outputs["ask"]["answer"] == "slow:slow mid:mid"
    evs = world.events(first.run_id)
    assert sorted(e.call_id or "" for e in evs if e.type is T.TOOL_CALLED) == [
        f"ask/{MODEL}/0", f"ask/{MODEL}/4", f"ask/{TOOL}.mid/3", f"ask/{TOOL}.slow/1"]
    again_shop = Agentic({"slow": 0.0, "fast": 0.0, "mid": 0.0}, args={"fast": {"wrong": 1}})
    again = world.rerun(first.run_id, agent_workflow(again_shop.durable()), world.recorded(first.run_id))
    assert again.completed and again.outputs == first.outputs and again_shop.ran == [] == again_shop.turns


def test_a_tool_declared_sequential_still_runs_alone_at_its_position(world: World) -> None:
    shop = Agentic({"slow": 0.2, "fast": 0.2, "mid": 0.2}, sequential=frozenset({"slow"}))
    res = arun(lambda: world.aio.run(agent_workflow(shop.durable()), {}))
    assert res.completed and shop.ran[0] == "slow"
    # slow alone first, then the other two together
    (_, slow_end), fast, mid = shop.spans["slow"], shop.spans["fast"], shop.spans["mid"]
    assert slow_end <= fast[0] and slow_end <= mid[0], shop.spans
    assert max(fast[0], mid[0]) < min(fast[1], mid[1]), shop.spans
    assert sorted(e.call_id or "" for e in world.events(res.run_id) if e.type is T.TOOL_CALLED
                  and e.tool != MODEL) == [f"ask/{TOOL}.fast/2", f"ask/{TOOL}.mid/3", f"ask/{TOOL}.slow/1"]


def test_calls_approved_through_deferred_results_keep_the_response_positions(world: World) -> None:
    ran: list[str] = []

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
            return ModelResponse(parts=[ToolCallPart("first", {"q": "1"}, tool_call_id="x"),
                                        ToolCallPart("second", {"q": "2"}, tool_call_id="y")])
        return ModelResponse(parts=[TextPart("approved and done")])

    def durable() -> RunlogAgent[None, Any]:
        agent = Agent(FunctionModel(respond), name="ok", output_type=[str, DeferredToolRequests],
                      capabilities=[Gate({"first": 0.1})])  # second reaches the toolset first
        for name, delay in (("first", 0.15), ("second", 0.0)):
            async def fn(q: str, name: str = name, delay: float = delay) -> str:
                await asyncio.sleep(delay)
                ran.append(name)
                return f"{name}:{q}"
            agent.tool_plain(name=name, requires_approval=True)(fn)
        return RunlogAgent(agent)

    def workflow() -> Workflow:
        d = durable()
        wf = Workflow("approve", "1")

        @wf.stage("ask")
        async def ask(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
            asked = await d.run(ctx, "go")
            assert isinstance(asked.output, DeferredToolRequests)
            approvals = DeferredToolResults(approvals={c.tool_call_id: True for c in asked.output.approvals})
            done = await d.run(ctx, message_history=asked.all_messages(), deferred_tool_results=approvals)
            return {"answer": done.output}

        return wf

    first = arun(lambda: world.aio.run(workflow(), {}))
    assert first.completed and first.outputs["ask"]["answer"] == "approved and done"
    assert ran == ["second", "first"]
    # deferred in the first agent run, positions 1 and 2 stay empty; the second agent run's approved
    # calls take its first positions, in the response's order (second reached the toolset first)
    assert sorted(e.call_id or "" for e in world.events(first.run_id) if e.type is T.TOOL_CALLED) == [
        "ask/pydantic_ai.model.ok/0", "ask/pydantic_ai.model.ok/5", "ask/pydantic_ai.tool.ok.first/3",
        "ask/pydantic_ai.tool.ok.second/4"]
    ran.clear()
    again = world.rerun(first.run_id, workflow(), world.recorded(first.run_id))
    assert again.completed and again.outputs == first.outputs and ran == []


def test_the_calls_of_a_history_ending_in_a_response_keep_its_order(world: World) -> None:
    """An agent run given a history that ends with a response makes that response's calls first."""
    shop = Agentic({"slow": 0.1, "fast": 0.0, "mid": 0.05}, hold={"slow": 0.05})
    pending = [ModelRequest(parts=[UserPromptPart("go")]),
               ModelResponse(parts=[ToolCallPart(n, {"q": n}, tool_call_id=f"h{i}")
                                    for i, n in enumerate(["slow", "fast", "mid"])])]

    def workflow(durable: RunlogAgent[None, str]) -> Workflow:
        wf = Workflow("history", "1")

        @wf.stage("ask")
        async def ask(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
            return {"answer": (await durable.run(ctx, message_history=pending)).output}

        return wf

    first = arun(lambda: world.aio.run(workflow(shop.durable()), {}))
    assert first.completed and first.outputs["ask"]["answer"] == "slow:slow fast:fast mid:mid"
    assert shop.ran == ["fast", "mid", "slow"] and shop.turns == [1]
    assert sorted(e.call_id or "" for e in world.events(first.run_id) if e.type is T.TOOL_CALLED) == [
        f"ask/{MODEL}/3", f"ask/{TOOL}.fast/1", f"ask/{TOOL}.mid/2", f"ask/{TOOL}.slow/0"]
    again_shop = Agentic({"slow": 0.0, "fast": 0.1, "mid": 0.0})
    again = world.rerun(first.run_id, workflow(again_shop.durable()),
                        _partial(world.recorded(first.run_id), {f"ask/{TOOL}.fast/1"}, set()))
    assert again.completed and again.outputs == first.outputs and sorted(again_shop.ran) == ["mid", "slow"]
    assert T.CALL_DIVERGED not in [e.type for e in world.events(first.run_id)]
