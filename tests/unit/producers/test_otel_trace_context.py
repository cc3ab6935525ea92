"""Trace context on the log: the runner's records carry their run span's W3C context, ``RUN_STARTED``
records it, the fold keeps it, and a take-over inside a processor span (:mod:`runlog.processors._tracing`)
continues the run's trace. In-memory adapters, a local TracerProvider (the global one is never set)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from runlog.processors._tracing import Tracing
from runlog.producers.base._trace import NO_TRACE, NoSpan
from runlog.producers.define._tools import CallInfo, tool
from runlog.producers.define._workflow import Workflow
from runlog.producers.otel import OtelTracer
from runlog.producers.run._context import StageContext
from runlog.projections.fold import fold_all
from runlog.schemas import EventType, RunEvent
from runlog.schemas._tracecontext import TraceContext, carrying, current, from_attributes, parse
from runlog.schemas.settings import Settings
from tests.unit.producers._replay import MemoryWorld, _take_over_args

T = EventType


class Spans:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name.startswith(prefix)]


@pytest.fixture
def spans() -> Iterator[Spans]:
    s = Spans()
    yield s
    s.provider.shutdown()


def workflow() -> Workflow:
    @tool("lookup")
    def lookup(call: CallInfo, q: str) -> dict[str, Any]:
        return {"a": q}

    wf = Workflow("traced", "1")

    @wf.stage("gather")
    def gather(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return ctx.call(lookup, q="x")

    @wf.stage("finish")
    def finish(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"done": True}

    return wf


def ctx_of(span: ReadableSpan) -> TraceContext:
    sc = span.context
    assert sc is not None
    tc = parse(f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags):02x}")
    assert tc is not None
    return tc


def traces(world: MemoryWorld, events: list[RunEvent]) -> list[TraceContext | None]:
    return [world.log.traces.get((e.run_id, e.seq, e.epoch)) for e in events]


def test_every_event_of_a_traced_run_carries_its_run_spans_context_and_run_started_records_it(
        spans: Spans) -> None:
    world = MemoryWorld(tracer=OtelTracer(spans.provider))
    res = world.runner.run(workflow(), {})
    assert res.completed
    (run,) = spans.named("runlog.run ")
    tc = ctx_of(run)
    events = world.events(res.run_id)
    assert traces(world, events) == [tc] * len(events)
    started = events[0]
    assert started.type is T.RUN_STARTED and from_attributes(started.attributes) == tc
    state = fold_all(events)
    assert state is not None and state.traceparent == tc.traceparent and state.tracestate is None


def test_an_untraced_run_writes_no_trace_context(spans: Spans) -> None:
    world = MemoryWorld()  # NO_TRACE
    res = world.runner.run(workflow(), {})
    events = world.events(res.run_id)
    assert res.completed and world.log.traces == {}
    assert "traceparent" not in events[0].attributes
    state = fold_all(events)
    assert state is not None and state.traceparent is None


def test_a_tracestate_of_the_callers_trace_is_recorded_and_folded(spans: Spans) -> None:
    world = MemoryWorld(tracer=OtelTracer(spans.provider))
    state = trace.TraceState([("vendor", "v1")])
    parent = trace.NonRecordingSpan(trace.SpanContext(0x1234, 0x5678, is_remote=True,
                                                      trace_flags=trace.TraceFlags(1), trace_state=state))
    token = otel_context.attach(trace.set_span_in_context(parent))
    try:
        res = world.runner.run(workflow(), {})
    finally:
        otel_context.detach(token)
    folded = fold_all(world.events(res.run_id))
    assert folded is not None and folded.tracestate == "vendor=v1"
    assert folded.traceparent is not None and folded.traceparent.startswith(f"00-{0x1234:032x}-")


def test_a_run_started_and_never_executed_ends_its_span_when_closed(spans: Spans) -> None:
    world = MemoryWorld(tracer=OtelTracer(spans.provider))
    h = world.runner.start_run(workflow(), {})
    assert h.session is not None and spans.named("runlog.run ") == []
    h.session.close()
    (run,) = spans.named("runlog.run ")
    assert world.log.traces[(h.run_id, 1, 1)] == ctx_of(run)


def test_a_take_over_inside_a_resume_span_continues_the_runs_trace(spans: Spans) -> None:
    world = MemoryWorld(tracer=OtelTracer(spans.provider))
    wf = workflow()
    first = world.runner.run(wf, {})
    (run1,) = spans.named("runlog.run ")
    events = world.events(first.run_id)
    state = fold_all(events)
    assert state is not None
    recorded = parse(state.traceparent, state.tracestate)
    asker = parse("00-99999999999999999999999999999999-8888888888888888-01")
    tracing = Tracing(Settings(), spans.provider)
    with tracing.span("runlog.resume", parent=recorded, links=[asker]):
        session = world.runner.take_over(first.run_id, **_take_over_args(events, wf, {}))
        world.runner.execute(session, from_stage="finish")
    (resume,) = spans.named("runlog.resume")
    run2 = [s for s in spans.named("runlog.run ") if s is not run1 and s.name == run1.name][-1]
    assert recorded is not None and asker is not None
    assert ctx_of(resume).trace_id == ctx_of(run2).trace_id == ctx_of(run1).trace_id
    assert resume.parent is not None and resume.parent.span_id == int(recorded.span_id, 16)
    assert run2.parent is not None and run2.parent.span_id == int(ctx_of(resume).span_id, 16)
    assert [(format(link.context.trace_id, "032x")) for link in resume.links] == [asker.trace_id]
    after = [e for e in world.events(first.run_id) if e.epoch == session.epoch]
    assert after[0].type is T.LEASE_ACQUIRED
    assert traces(world, after) == [ctx_of(resume)] + [ctx_of(run2)] * (len(after) - 1)
    assert current() is None


def test_tracing_off_opens_no_span_and_carries_no_context(spans: Spans) -> None:
    tracing = Tracing(Settings(tracing=False), spans.provider)
    assert not tracing.enabled and tracing.runner_tracer() is NO_TRACE
    recorded = parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    with tracing.span("runlog.resume", parent=recorded) as span:
        assert isinstance(span, NoSpan) and current() is None
    assert isinstance(tracing.start("runlog.project"), NoSpan)
    assert spans.exporter.get_finished_spans() == ()
    assert Settings.from_env({"RUNLOG_TRACING": "false"}).tracing is False
    assert Settings.from_env({}).tracing is True


def test_a_failed_block_marks_its_span_failed_with_the_type_only(spans: Spans) -> None:
    tracing = Tracing(Settings(), spans.provider)
    with pytest.raises(ValueError), tracing.span("runlog cancel", attributes={"run_id": "r"}) as span:
        assert current() == getattr(span, "trace_context", None) and current() is not None
        raise ValueError("token=s3cr3t")
    (s,) = spans.named("runlog cancel")
    assert s.status.status_code is trace.StatusCode.ERROR and s.status.description == "ValueError"
    assert "s3cr3t" not in repr(s.to_json()) and current() is None


def test_without_opentelemetry_nothing_is_traced(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    for name in [m for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "runlog.producers.otel")
    tracing = Tracing(Settings())
    assert not tracing.enabled and tracing.runner_tracer() is NO_TRACE
    with tracing.span("runlog cancel") as span:
        assert isinstance(span, NoSpan) and current() is None


def test_with_no_provider_a_recorded_context_is_still_passed_on() -> None:
    tracing = Tracing(Settings(), trace.NoOpTracerProvider())
    recorded = parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "k=v")
    with tracing.span("runlog.resume", parent=recorded):
        assert current() == recorded
    with tracing.span("runlog cancel"):
        assert current() is None  # nothing to pass on: no headers
    with carrying(recorded), tracing.span("runlog cancel"):
        assert current() == recorded  # a no-op span hides no context already carried


def test_the_headers_are_what_opentelemetrys_w3c_propagator_reads(spans: Spans) -> None:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    world = MemoryWorld(tracer=OtelTracer(spans.provider))
    res = world.runner.run(workflow(), {})
    (run,) = spans.named("runlog.run ")
    tc = world.log.traces[(res.run_id, 2, 1)]
    carrier = {k: v.decode() for k, v in tc.headers}
    extracted = trace.get_current_span(TraceContextTextMapPropagator().extract(carrier)).get_span_context()
    assert run.context is not None
    assert (extracted.trace_id, extracted.span_id) == (run.context.trace_id, run.context.span_id)


def test_an_async_runner_puts_the_same_context_on_its_records(spans: Spans) -> None:
    import asyncio

    world = MemoryWorld()
    runner = world.async_runner(tracer=OtelTracer(spans.provider))
    res = asyncio.run(runner.run(workflow(), {}))
    assert res.completed
    (run,) = spans.named("runlog.run ")
    events = world.events(res.run_id)
    assert traces(world, events) == [ctx_of(run)] * len(events)
    assert from_attributes(events[0].attributes) == ctx_of(run)


def test_recording_says_whether_the_provider_can_record(spans: Spans) -> None:
    assert Tracing(Settings(), spans.provider).recording
    assert not Tracing(Settings(), trace.NoOpTracerProvider()).recording
    assert not Tracing(Settings(tracing=False), spans.provider).recording
