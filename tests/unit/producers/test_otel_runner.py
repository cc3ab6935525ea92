"""Spans of real runs: the Runner on the in-memory adapters with ``tracer=OtelTracer(...)``
on a local TracerProvider (the global provider is never set)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from runlog.producers.define._inputs import DictInputSource
from runlog.producers.define._tools import CallInfo, Tool, tool
from runlog.producers.define._workflow import Workflow
from runlog.producers.log._memory import (
    InMemoryLeaseManager,
    InMemoryLeaseTable,
)
from runlog.producers.otel import OtelTracer
from runlog.producers.run._arunner import AsyncRunner
from runlog.producers.run._context import AsyncStageContext, StageContext
from runlog.schemas import EventType, ReplayPolicy
from runlog.schemas.errors import TerminalToolError
from tests.unit.producers._replay import MemoryWorld
from tests.unit.producers.test_otel import assert_nowhere

T = EventType
# What the tools are given and give back: none of it may reach a span.
TOPIC = "s3cr3t-token-123"
NAME = "hunter2-api-key-456"
HIT = "sk-live-result-789"
EXTERNAL = "ext-result-secret-000"
PAYLOADS = (TOPIC, NAME, HIT, EXTERNAL)
SOURCE = DictInputSource({"facts": {"v1": {"claims": ["confidential-claim-xyz"]}}})


class World(MemoryWorld):
    """The in-memory adapters and a runner whose spans land in memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        super().__init__(SOURCE, max_parallel=2, tracer=OtelTracer(self.provider))
        self.calls: list[str] = []

    def spans(self, kind: str) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name.startswith(f"runlog.{kind} ")]

    def all_spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def tools(self) -> tuple[Tool, Tool]:
        @tool("search", policy=ReplayPolicy.SAFE)
        def search(call: CallInfo, q: str) -> dict[str, Any]:
            self.calls.append("search")
            return {"hits": [HIT, q]}

        @tool("upload", policy=ReplayPolicy.IDEMPOTENT, effect=True, target="cdn:assets",
              delivery=lambda a, c: ("acct", "cdn", "asset-1", "1"))
        def upload(call: CallInfo, name: str) -> dict[str, Any]:
            self.calls.append("upload")
            return {"external_id": EXTERNAL, "name": name}

        return search, upload

    def workflow(self) -> Workflow:
        search, upload = self.tools()
        wf = Workflow("article", "1")

        @wf.stage("research", inputs=["facts"])
        def research(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
            return {"hits": ctx.call(search, q=ctx.params["topic"])["hits"]}

        @wf.stage("publish")
        def publish(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
            return {"asset": ctx.call(upload, name=NAME)["external_id"]}

        return wf


@pytest.fixture
def world() -> Iterator[World]:
    w = World()
    yield w
    w.runner.close()
    w.provider.shutdown()


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def ids(span: ReadableSpan) -> tuple[int, int]:
    assert span.context is not None
    return span.context.trace_id, span.context.span_id


def by_attr(spans: list[ReadableSpan], key: str, value: Any) -> ReadableSpan:
    found = [s for s in spans if attrs(s).get(key) == value]
    assert len(found) == 1, [attrs(s) for s in spans]
    return found[0]


def seq_of(world: World, run_id: str, type_: EventType, call_id: str | None = None,
           stage: str | None = None, epoch: int | None = None) -> int:
    (e,) = [e for e in world.log.events(run_id) if e.type is type_
            and (call_id is None or e.call_id == call_id) and (stage is None or e.stage == stage)
            and (epoch is None or e.epoch == epoch)]
    return e.seq


def test_a_run_gives_a_run_span_stage_spans_and_call_spans(world: World) -> None:
    before = otel_context.get_current()
    res = world.runner.run(world.workflow(), {"topic": TOPIC})
    assert res.completed and world.calls == ["search", "upload"]
    assert otel_context.get_current() is before
    (run,) = world.spans("run")
    stages = world.spans("stage")
    calls = world.spans("call")
    assert len(stages) == 2 and len(calls) == 2
    ra = attrs(run)
    assert ra["runlog.run_id"] == res.run_id and ra["runlog.epoch"] == 1
    assert ra["runlog.workflow"].startswith("article")
    assert ra["runlog.seq"] == res.last_seq and ra["runlog.outcome"] == "completed"
    assert run.parent is None and run.status.status_code is not StatusCode.ERROR

    research = by_attr(stages, "runlog.stage", "research")
    publish = by_attr(stages, "runlog.stage", "publish")
    for st in (research, publish):
        a = attrs(st)
        assert a["runlog.run_id"] == res.run_id and a["runlog.epoch"] == 1
        assert a["runlog.outcome"] == "verified"
        assert parent_id(st) == ids(run)[1] and ids(st)[0] == ids(run)[0]
        assert st.status.status_code is not StatusCode.ERROR
    assert attrs(research)["runlog.seq"] == seq_of(world, res.run_id, T.STAGE_STARTED, stage="research")
    assert attrs(publish)["runlog.seq"] == seq_of(world, res.run_id, T.STAGE_STARTED, stage="publish")

    search = by_attr(calls, "runlog.tool", "search")
    upload = by_attr(calls, "runlog.tool", "upload")
    assert parent_id(search) == ids(research)[1] and parent_id(upload) == ids(publish)[1]
    for call, call_id, policy in ((search, "research/search/0", "SAFE"),
                                  (upload, "publish/upload/0", "IDEMPOTENT")):
        a = attrs(call)
        assert a["runlog.run_id"] == res.run_id and a["runlog.epoch"] == 1
        assert a["runlog.call_id"] == call_id and a["runlog.replay_policy"] == policy
        assert a["runlog.seq"] == seq_of(world, res.run_id, T.TOOL_CALLED, call_id=call_id)
        assert a["runlog.reused"] is False and a["runlog.source"] == "executed"
        assert ids(call)[0] == ids(run)[0] and call.status.status_code is not StatusCode.ERROR
    assert "runlog.delivery_key" not in attrs(search)
    dk = world.log.events(res.run_id)[seq_of(world, res.run_id, T.EFFECT_INTENT) - 1].delivery_key
    assert dk and attrs(upload)["runlog.delivery_key"] == dk
    assert_nowhere(world.all_spans(), *PAYLOADS, "confidential-claim-xyz")


def test_recorded_calls_give_reused_call_spans(world: World) -> None:
    wf = world.workflow()
    first = world.runner.run(wf, {"topic": TOPIC})
    world.exporter.clear()
    res = world.again(first.run_id, wf, {"topic": TOPIC}, recorded_calls=world.recorded(first.run_id))
    assert res.completed and res.epoch == 2 and world.calls == ["search", "upload"]
    (run,) = world.spans("run")
    assert attrs(run)["runlog.epoch"] == 2 and attrs(run)["runlog.run_id"] == first.run_id
    assert len(world.spans("stage")) == 2
    calls = world.spans("call")
    assert len(calls) == 2
    for call in calls:
        a = attrs(call)
        assert a["runlog.epoch"] == 2 and a["runlog.run_id"] == first.run_id
        assert a["runlog.reused"] is True and a["runlog.source"] == "recorded"
        assert "runlog.seq" not in a  # nothing was appended for a reused call
        assert call.status.status_code is not StatusCode.ERROR
    assert_nowhere(world.all_spans(), *PAYLOADS)


def test_a_failing_tool_gives_error_call_and_stage_spans(world: World) -> None:
    @tool("charge", policy=ReplayPolicy.SAFE)
    def charge(call: CallInfo, card: str) -> dict[str, Any]:
        raise TerminalToolError(f"card {card} declined, token {TOPIC}")

    wf = Workflow("pay", "1")
    wf.stage("pay")(lambda ctx, inputs: dict(ctx.call(charge, card=NAME)))
    with pytest.raises(TerminalToolError):
        world.runner.run(wf, {"topic": TOPIC})
    (call,) = world.spans("call")
    (stage,) = world.spans("stage")
    (run,) = world.spans("run")
    for s in (call, stage, run):
        assert s.status.status_code is StatusCode.ERROR
        assert s.status.description == "TerminalToolError"
    assert attrs(call)["runlog.reused"] is False and attrs(call)["runlog.tool"] == "charge"
    assert attrs(stage)["runlog.outcome"] == "failed" and attrs(run)["runlog.outcome"] == "failed"
    assert [e.name for e in call.events] == ["exception"]
    assert_nowhere(world.all_spans(), *PAYLOADS)


def test_a_run_nests_under_the_callers_span(world: World) -> None:
    with world.provider.get_tracer("app").start_as_current_span("POST /articles") as request:
        inside = otel_context.get_current()
        world.runner.run(world.workflow(), {"topic": TOPIC})
        assert otel_context.get_current() is inside
    (run,) = world.spans("run")
    assert parent_id(run) == request.get_span_context().span_id
    assert {ids(s)[0] for s in world.all_spans()} == {request.get_span_context().trace_id}


def test_async_runs_interleaved_on_one_loop_keep_their_own_spans(world: World) -> None:
    """Four runs at once on one loop (``async def`` stage and tools, and a ``def`` stage on a
    worker thread): every span is in its own run's trace, under its own run and stage."""
    runner = AsyncRunner(world.log, InMemoryLeaseManager(InMemoryLeaseTable(), holder="w-async"),
                         world.store, source=SOURCE, ledger=world.ledger, run_log=world.log,
                         tracer=OtelTracer(world.provider))

    @tool("lookup", policy=ReplayPolicy.SAFE)
    async def lookup(call: CallInfo, q: str) -> dict[str, Any]:
        await asyncio.sleep(0.001)  # the other runs' calls go on meanwhile
        return {"hit": HIT, "q": q}

    @tool("send", policy=ReplayPolicy.IDEMPOTENT, effect=True, target="mail:out",
          delivery=lambda a, c: ("acct", "mail", c.run_id, "1"))
    async def send(call: CallInfo, body: str) -> dict[str, Any]:
        await asyncio.sleep(0.001)
        return {"external_id": EXTERNAL}

    wf = Workflow("notify", "1")

    @wf.stage("gather")
    async def gather(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        a, b = await ctx.parallel((lookup, {"q": TOPIC}), (lookup, {"q": NAME}))
        return {"hits": [a["hit"], b["hit"]]}

    @wf.stage("deliver")
    def deliver(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"id": ctx.call(send, body=f"{NAME} {TOPIC}")["external_id"]}

    async def main() -> list[str]:
        before = otel_context.get_current()
        results = await asyncio.gather(*(runner.run(wf, {"topic": TOPIC}) for _ in range(4)))
        assert otel_context.get_current() is before
        await runner.aclose()
        return [r.run_id for r in results if r.completed]

    try:
        run_ids = asyncio.run(main())
    finally:
        runner.executor.shutdown(wait=True)
    assert len(run_ids) == 4
    spans = world.all_spans()
    assert len(world.spans("run")) == 4 and len(world.spans("stage")) == 8 and len(world.spans("call")) == 12
    span_ids = {ids(s)[1]: s for s in spans}
    for run_id in run_ids:
        mine = [s for s in spans if attrs(s)["runlog.run_id"] == run_id]
        (run,) = [s for s in mine if s.name == "runlog.run notify"]
        assert len(mine) == 1 + 2 + 3 and {ids(s)[0] for s in mine} == {ids(run)[0]}
        for s in mine:
            if s.name.startswith("runlog.stage "):
                assert parent_id(s) == ids(run)[1]
            elif s.name.startswith("runlog.call "):
                parent = span_ids[parent_id(s) or 0]
                assert parent.name == "runlog.stage " + attrs(s)["runlog.stage"]
                assert attrs(parent)["runlog.run_id"] == run_id
                assert attrs(s)["runlog.reused"] is False and attrs(s)["runlog.source"] == "executed"
        assert sorted(attrs(s)["runlog.call_id"] for s in mine if s.name.startswith("runlog.call ")) == [
            "deliver/send/0", "gather/lookup/0", "gather/lookup/1"]
    assert_nowhere(spans, *PAYLOADS)
