"""OpenTelemetry spans for runs, stages and tool calls (the ``runlog[otel]`` extra).

``Runner(..., tracer=OtelTracer())`` maps the runner's trace hooks
(:mod:`producers.run._trace`) onto OpenTelemetry spans:

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

A failed span (``end(error)``) gets status ``ERROR`` with the exception's type name as its
description, the attribute ``error.type`` (the qualified type name) and an ``exception``
event carrying only ``exception.type``. The exception's message and stack trace are left
out: a tool's exception can quote its arguments, a response or a credential, and a span
must never carry those.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum

try:
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace import Status, StatusCode
except ImportError as e:  # pragma: no cover - exercised by a test with the package hidden
    raise ImportError("producers.otel needs OpenTelemetry: pip install 'runlog[otel]'") from e

from producers.run._trace import AttrValue, Span, SpanKind

__all__ = ["OtelSpan", "OtelTracer"]

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


class OtelSpan:
    """One OpenTelemetry span behind the runner's :class:`~producers.run._trace.Span`."""

    __slots__ = ("_ended", "context", "span")

    def __init__(self, span: trace.Span, context: Context) -> None:
        self.span = span
        self.context = context
        """The context its children start in: the one it was started in, with it as the span."""
        self._ended = False

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
    """The runner's :class:`~producers.run._trace.Tracer` on OpenTelemetry.

    Args:
        tracer_provider: where spans go; None: the global provider
            (``opentelemetry.trace.set_tracer_provider``).
        name: the instrumentation scope's name.
    """

    def __init__(self, tracer_provider: trace.TracerProvider | None = None, *,
                 name: str = "runlog") -> None:
        self._tracer = trace.get_tracer(name, tracer_provider=tracer_provider)

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
