"""OpenTelemetry spans for runs, stages and tool calls (the ``runlog[otel]`` extra).

``Runner(..., tracer=OtelTracer())`` maps the runner's trace hooks
(:mod:`runlog.producers.base._trace`) onto OpenTelemetry spans:

* one span per run, per stage and per tool call, named ``runlog.<kind> <name>``
  (``runlog.run article``, ``runlog.stage research``, ``runlog.call search``), all of kind
  ``INTERNAL``;
* attributes prefixed ``runlog.`` (``runlog.run_id``, ``runlog.seq``, ...). Only ``str``,
  ``int``, ``float`` and ``bool`` values are kept (an enum gives its value); None and any
  other type are dropped, never converted to text;
* a stage's parent is its run span, a call's its stage span. A run span's parent is the
  caller's current context, so a run started inside a request span nests under it;
* spans are started with explicit parent contexts and never made current: many runs share
  one event loop or run in threads, so the caller's current context is never changed.

Trace context on the log: a run span's W3C context (:attr:`OtelSpan.trace_context`) goes into the
``traceparent`` / ``tracestate`` headers of the run's records and into its ``RUN_STARTED``
attributes, so a resume in another process continues the run's trace
(:mod:`runlog.schemas._tracecontext`). :meth:`OtelTracer.start_span` opens the spans of Runlog's processors
(a resume, an operator command, a projector batch): a parent given as a recorded context, links to
the contexts of the records that caused them.

A failed span (``end(error)``) gets status ``ERROR`` with the exception's type name as its
description, the attribute ``error.type`` (the qualified type name) and an ``exception``
event carrying only ``exception.type``. The exception's message and stack trace are left
out: a tool's exception can quote its arguments, a response or a credential, and a span
must never carry those.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Literal

try:
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace import (
        Link,
        NonRecordingSpan,
        SpanContext,
        Status,
        StatusCode,
        TraceFlags,
        TraceState,
    )
except ImportError as e:  # pragma: no cover - exercised by a test with the package hidden
    raise ImportError("runlog.producers.otel needs OpenTelemetry: pip install 'runlog[otel]'") from e

from runlog.producers.base._trace import AttrValue, Span, SpanKind
from runlog.schemas.internal import TraceContext

__all__ = ["OtelSpan", "OtelTracer", "remote_context", "span_context", "trace_context"]

PREFIX = "runlog."


def _value(value: object) -> AttrValue | None:
    """``value`` as a plain str/int/float/bool, or None when it is of any other type."""
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str.__str__(value)
    return None


def _type_name(error: BaseException) -> str:
    t = type(error)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def span_context(tc: TraceContext) -> SpanContext:
    """A recorded W3C context as a remote OpenTelemetry span context."""
    state = TraceState.from_header([tc.tracestate]) if tc.tracestate else None
    return SpanContext(int(tc.trace_id, 16), int(tc.span_id, 16), is_remote=True,
                       trace_flags=TraceFlags(int(tc.traceparent[53:55], 16) & 0xFF), trace_state=state)


def remote_context(tc: TraceContext) -> Context:
    """A context whose span is the recorded one: what a span continuing it starts in."""
    return trace.set_span_in_context(NonRecordingSpan(span_context(tc)))


def trace_context(ctx: SpanContext) -> TraceContext | None:
    """An OpenTelemetry span context as the W3C context records carry (None when invalid)."""
    if not ctx.is_valid:
        return None
    state = ctx.trace_state.to_header() if ctx.trace_state else ""
    return TraceContext(f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags) & 0xFF:02x}", state)


class OtelSpan:
    """One OpenTelemetry span behind the runner's :class:`~runlog.producers.base._trace.Span`."""

    __slots__ = ("_ended", "_trace", "context", "span")

    def __init__(self, span: trace.Span, context: Context) -> None:
        self.span = span
        self.context = context
        """The context its children start in: the one it was started in, with it as the span."""
        self._ended = False
        self._trace: TraceContext | None = trace_context(span.get_span_context())

    @property
    def trace_context(self) -> TraceContext | None:
        """Its W3C context, as the records written under it carry it (None for an invalid span:
        a no-op provider's span with no parent)."""
        return self._trace

    def set(self, key: str, value: AttrValue) -> None:
        v = _value(value)
        if v is not None and not self._ended:
            self.span.set_attribute(PREFIX + key, v)

    def end(self, error: BaseException | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        if error is not None:
            type_name = _type_name(error)
            self.span.set_attribute("error.type", type_name)
            self.span.add_event("exception", {"exception.type": type_name})
            self.span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        self.span.end()


class OtelTracer:
    """The runner's :class:`~runlog.producers.base._trace.Tracer` on OpenTelemetry.

    Args:
        tracer_provider: where spans go; None: the global provider
            (``opentelemetry.trace.set_tracer_provider``).
        name: the instrumentation scope's name.
    """

    def __init__(self, tracer_provider: trace.TracerProvider | None = None, *,
                 name: str = "runlog") -> None:
        self._tracer = trace.get_tracer(name, tracer_provider=tracer_provider)
        self._provider = tracer_provider

    @property
    def configured(self) -> bool:
        """Whether its provider can record: one was passed in, or the global one was set (else
        OpenTelemetry's default records nothing, and work done only for a span can be skipped)."""
        provider = self._provider if self._provider is not None else trace.get_tracer_provider()
        return not isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))

    def start(self, kind: SpanKind, name: str, parent: Span | None,
              attributes: Mapping[str, AttrValue]) -> Span:
        # A parent from another tracer (or none) gives way to the caller's current context.
        base = parent.context if isinstance(parent, OtelSpan) else None
        attrs: dict[str, AttrValue] = {}
        for key, value in attributes.items():
            v = _value(value)
            if v is not None:
                attrs[PREFIX + key] = v
        span = self._tracer.start_span(f"runlog.{kind} {name}", context=base,
                                       kind=trace.SpanKind.INTERNAL, attributes=attrs,
                                       record_exception=False, set_status_on_exception=False)
        return OtelSpan(span, trace.set_span_in_context(span, base))

    def start_span(self, name: str, *, parent: TraceContext | None = None, links: Iterable[TraceContext] = (),
                   attributes: Mapping[str, AttrValue] | None = None,
                   kind: Literal["internal", "consumer", "client"] = "internal") -> OtelSpan:
        """A span named ``name`` (not made current): its parent the recorded context ``parent``, else
        the caller's current one; a link to each distinct context of ``links`` (not its parent's).
        Attributes are prefixed ``runlog.`` and kept only when plain values, as the runner's are."""
        base = remote_context(parent) if parent is not None else None
        seen = {parent.traceparent} if parent is not None else set()
        linked = []
        for tc in links:
            if tc.traceparent not in seen:
                seen.add(tc.traceparent)
                linked.append(Link(span_context(tc)))
        attrs: dict[str, AttrValue] = {}
        for key, value in (attributes or {}).items():
            v = _value(value)
            if v is not None:
                attrs[PREFIX + key] = v
        span = self._tracer.start_span(name, context=base, kind=_KINDS[kind], attributes=attrs, links=linked,
                                       record_exception=False, set_status_on_exception=False)
        return OtelSpan(span, trace.set_span_in_context(span, base))


_KINDS = {"internal": trace.SpanKind.INTERNAL, "consumer": trace.SpanKind.CONSUMER,
          "client": trace.SpanKind.CLIENT}
