"""The OpenTelemetry adapter of the trace hooks, on a local TracerProvider and an in-memory
exporter (the global provider is never set)."""

from __future__ import annotations

import asyncio
import importlib
import sys
import threading
from collections.abc import Iterator
from enum import StrEnum
from typing import cast

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from runlog.producers.base._trace import NO_TRACE, AttrValue, NoSpan, Tracer
from runlog.producers.otel import OtelSpan, OtelTracer

SECRET = "s3cr3t-token-123"


class Spans:
    """A local provider whose finished spans land in memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = OtelTracer(self.provider)

    def finished(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> ReadableSpan:
        found = [s for s in self.finished() if s.name == name]
        assert len(found) == 1, [s.name for s in self.finished()]
        return found[0]


@pytest.fixture
def spans() -> Iterator[Spans]:
    s = Spans()
    yield s
    s.provider.shutdown()


def _parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def _ids(span: ReadableSpan) -> tuple[int, int]:
    ctx = span.context
    assert ctx is not None
    return ctx.trace_id, ctx.span_id


def test_it_is_a_tracer() -> None:
    t: Tracer = OtelTracer(TracerProvider())
    assert isinstance(t.start("run", "w", None, {}), OtelSpan)
    assert NO_TRACE.start("run", "w", None, {}) is not None


def test_names_kind_and_prefixed_attributes(spans: Spans) -> None:
    run = spans.tracer.start("run", "article", None, {"run_id": "run-1", "workflow": "article@1", "epoch": 1})
    run.set("seq", 12)
    run.set("outcome", "completed")
    run.end()
    s = spans.named("runlog.run article")
    assert s.kind is trace.SpanKind.INTERNAL
    assert dict(s.attributes or {}) == {"runlog.run_id": "run-1", "runlog.workflow": "article@1",
                                        "runlog.epoch": 1, "runlog.seq": 12, "runlog.outcome": "completed"}
    assert s.status.status_code is StatusCode.UNSET
    assert s.instrumentation_scope is not None and s.instrumentation_scope.name == "runlog"


def test_the_scope_name_can_be_chosen() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    OtelTracer(provider, name="billing").start("run", "w", None, {}).end()
    (s,) = exporter.get_finished_spans()
    assert s.instrumentation_scope is not None and s.instrumentation_scope.name == "billing"


def test_stages_and_calls_are_children_in_the_runs_trace(spans: Spans) -> None:
    run = spans.tracer.start("run", "article", None, {"run_id": "run-1"})
    stage = spans.tracer.start("stage", "research", run, {"run_id": "run-1", "stage": "research"})
    call = spans.tracer.start("call", "search", stage, {"run_id": "run-1", "call_id": "research/search/0"})
    call.end()
    stage.end()
    run.end()
    r, s, c = (spans.named(n) for n in ("runlog.run article", "runlog.stage research", "runlog.call search"))
    assert [x.name for x in spans.finished()] == [c.name, s.name, r.name]
    assert r.parent is None  # no current span: the run is a root
    assert _ids(s)[0] == _ids(c)[0] == _ids(r)[0]
    assert _parent_id(s) == _ids(r)[1] and _parent_id(c) == _ids(s)[1]


def test_a_run_span_nests_under_the_callers_current_span(spans: Spans) -> None:
    request_tracer = spans.provider.get_tracer("app")
    with request_tracer.start_as_current_span("POST /articles") as request:
        run = spans.tracer.start("run", "article", None, {"run_id": "run-1"})
        stage = spans.tracer.start("stage", "research", run, {})
    # the stage keeps its run as parent even when started outside the request span
    call = spans.tracer.start("call", "search", stage, {})
    for x in (call, stage, run):
        x.end()
    req = spans.named("POST /articles")
    r = spans.named("runlog.run article")
    assert _ids(r)[0] == request.get_span_context().trace_id == _ids(req)[0]
    assert _parent_id(r) == _ids(req)[1]
    assert _parent_id(spans.named("runlog.stage research")) == _ids(r)[1]
    assert _parent_id(spans.named("runlog.call search")) == _ids(spans.named("runlog.stage research"))[1]


def test_spans_never_change_the_current_context(spans: Spans) -> None:
    before = otel_context.get_current()
    run = spans.tracer.start("run", "article", None, {})
    assert otel_context.get_current() is before
    stage = spans.tracer.start("stage", "s", run, {})
    call = spans.tracer.start("call", "t", stage, {})
    assert otel_context.get_current() is before
    call.set("reused", False)
    call.end(RuntimeError("x"))
    stage.end()
    run.end()
    assert otel_context.get_current() is before
    assert trace.get_current_span() is trace.INVALID_SPAN
    with spans.provider.get_tracer("app").start_as_current_span("request") as request:
        inside = otel_context.get_current()
        run = spans.tracer.start("run", "article", None, {})
        spans.tracer.start("stage", "s", run, {}).end()
        run.end()
        assert otel_context.get_current() is inside and trace.get_current_span() is request


def test_an_error_sets_error_status_with_its_type_only(spans: Spans) -> None:
    run = spans.tracer.start("run", "w", None, {})
    call = spans.tracer.start("call", "upload", run, {"tool": "upload"})
    call.end(ValueError(f"bad request: token={SECRET}"))
    run.end(KeyError(SECRET))
    c = spans.named("runlog.call upload")
    assert c.status.status_code is StatusCode.ERROR and c.status.description == "ValueError"
    assert (c.attributes or {})["error.type"] == "ValueError"
    (ev,) = c.events
    assert ev.name == "exception" and dict(ev.attributes or {}) == {"exception.type": "ValueError"}
    r = spans.named("runlog.run w")
    assert r.status.status_code is StatusCode.ERROR and r.status.description == "KeyError"
    assert_nowhere(spans.finished(), SECRET)


def test_an_error_of_a_module_is_named_with_its_module(spans: Spans) -> None:
    from runlog.schemas.errors import TerminalToolError

    span = spans.tracer.start("call", "t", None, {})
    span.end(TerminalToolError(SECRET))
    s = spans.named("runlog.call t")
    assert s.status.description == "TerminalToolError"
    assert (s.attributes or {})["error.type"] == "runlog.schemas.errors.TerminalToolError"
    assert_nowhere(spans.finished(), SECRET)


class Policy(StrEnum):
    SAFE = "SAFE"


def test_only_plain_values_are_kept(spans: Spans) -> None:
    attrs = cast(dict[str, AttrValue], {
        "a": "x", "b": 1, "c": 1.5, "d": True, "none": None, "policy": Policy.SAFE,
        "dict": {"token": SECRET}, "list": [SECRET], "bytes": SECRET.encode(),
    })
    span = spans.tracer.start("call", "t", None, attrs)
    span.set("reused", False)
    span.set("later", cast(AttrValue, None))
    span.set("obj", cast(AttrValue, {"k": SECRET}))
    span.end()
    got = dict(spans.named("runlog.call t").attributes or {})
    assert got == {"runlog.a": "x", "runlog.b": 1, "runlog.c": 1.5, "runlog.d": True,
                   "runlog.policy": "SAFE", "runlog.reused": False}
    assert type(got["runlog.policy"]) is str and type(got["runlog.reused"]) is bool
    assert_nowhere(spans.finished(), SECRET)


def test_end_twice_and_set_after_end_are_ignored(spans: Spans, caplog: pytest.LogCaptureFixture) -> None:
    span = spans.tracer.start("stage", "s", None, {})
    span.end()
    span.end(RuntimeError("late"))
    span.set("outcome", "late")
    (s,) = spans.finished()
    assert s.status.status_code is StatusCode.UNSET and "runlog.outcome" not in (s.attributes or {})
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry")]


def test_a_parent_from_another_tracer_gives_way_to_the_current_context(spans: Spans) -> None:
    with spans.provider.get_tracer("app").start_as_current_span("request"):
        spans.tracer.start("stage", "s", NoSpan(), {}).end()
    assert _parent_id(spans.named("runlog.stage s")) == _ids(spans.named("request"))[1]


def test_interleaved_runs_on_one_loop_and_in_threads_keep_their_parents(spans: Spans) -> None:
    tracer = spans.tracer

    async def one_run(i: int) -> None:
        run = tracer.start("run", f"w{i}", None, {"run_id": f"run-{i}"})
        for n in range(3):
            stage = tracer.start("stage", f"w{i}-s{n}", run, {})
            await asyncio.sleep(0)  # let the other runs start their stages in between
            call = tracer.start("call", f"w{i}-s{n}-t", stage, {})
            await asyncio.sleep(0)
            call.end()
            stage.end()
        run.end()

    async def main() -> None:
        await asyncio.gather(*(one_run(i) for i in range(4)))

    asyncio.run(main())

    def in_thread(i: int) -> None:
        asyncio.run(one_run(i))

    threads = [threading.Thread(target=in_thread, args=(i,)) for i in range(4, 8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(8):
        run = spans.named(f"runlog.run w{i}")
        assert run.parent is None
        for n in range(3):
            stage = spans.named(f"runlog.stage w{i}-s{n}")
            call = spans.named(f"runlog.call w{i}-s{n}-t")
            assert _parent_id(stage) == _ids(run)[1] and _parent_id(call) == _ids(stage)[1]
            assert _ids(stage)[0] == _ids(call)[0] == _ids(run)[0]
    assert len({_ids(spans.named(f"runlog.run w{i}"))[0] for i in range(8)}) == 8


def test_the_global_provider_is_the_default() -> None:
    # Not set in tests: the API's default provider gives spans that record nothing.
    t = OtelTracer()
    before = otel_context.get_current()
    run = t.start("run", "w", None, {"run_id": "r"})
    t.start("stage", "s", run, {}).end(RuntimeError("x"))
    run.set("seq", 1)
    run.end()
    assert otel_context.get_current() is before


def test_importing_without_opentelemetry_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "runlog.producers.otel")
    with pytest.raises(ImportError, match=r"pip install 'runlog\[otel\]'") as info:
        importlib.import_module("runlog.producers.otel")
    assert "\n" not in str(info.value)


def assert_nowhere(spans: list[ReadableSpan], *needles: str) -> None:
    """No span name, attribute, status or event (name or attribute) contains any needle."""
    texts: list[str] = []
    for s in spans:
        texts += [s.name, s.status.description or ""]
        texts += [repr(v) for v in (s.attributes or {}).values()]
        for ev in s.events:
            texts.append(ev.name)
            texts += [repr(v) for v in (ev.attributes or {}).values()]
        for link in s.links:
            texts += [repr(v) for v in (link.attributes or {}).values()]
        if s.resource is not None:
            texts += [repr(v) for v in s.resource.attributes.values()]
    for needle in needles:
        hits = [t for t in texts if needle in t]
        assert not hits, f"{needle!r} found in span data: {hits}"
