"""Trace hooks: the runner opens a span per run, per stage and per tool call.

The default :data:`NO_TRACE` does nothing. ``runlog.producers.otel.OtelTracer`` (the
``runlog[otel]`` extra) maps them onto OpenTelemetry spans. A span's attributes are
identifiers and protocol facts only (run id, seq, epoch, replay policy, delivery key,
whether the result was reused): never payloads, arguments or credentials.

Attribute names (all prefixed ``runlog.``):

* run (one per :meth:`Runner.execute`, so a resume is a new run span at its new epoch): ``run_id``,
  ``workflow`` (name), ``epoch``, ``seq`` (the last seq at the end), ``outcome`` (``completed`` /
  ``waiting`` / ``blocked`` / ``failed``, or ``stopped``: executed without completing, the lease
  lost, a delivery failed);
* stage: ``run_id``, ``stage``, ``epoch``, ``seq`` (its ``STAGE_STARTED``), ``outcome``
  (``verified`` / ``failed`` / ``blocked`` / ``waiting``);
* call: ``run_id``, ``stage``, ``call_id``, ``tool``, ``epoch``, ``replay_policy``, ``seq``
  (its ``TOOL_CALLED``, when one was appended), ``delivery_key`` (effect tools), ``reused``
  (True when no tool function ran: a recorded, reconciled or ledger result), ``source``
  (``recorded`` / ``reconciled`` / ``ledger`` / ``executed``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, Protocol

from runlog.schemas.internal import TraceContext

__all__ = ["NO_TRACE", "AttrValue", "NoSpan", "Span", "SpanKind", "Tracer", "context_of"]

AttrValue = str | int | float | bool
SpanKind = Literal["run", "stage", "call"]


class Span(Protocol):
    """One open span."""

    def set(self, key: str, value: AttrValue) -> None:
        """Set attribute ``runlog.<key>``."""

    def end(self, error: BaseException | None = None) -> None:
        """Close the span; ``error`` marks it failed. An adapter records the error's type only:
        messages may quote payloads (a tool's own exception text, a rule's output values)."""


class Tracer(Protocol):
    """Opens spans; ``parent`` is the enclosing run or stage span (None for a run span: the
    caller's current context is the parent)."""

    def start(self, kind: SpanKind, name: str, parent: Span | None,
              attributes: Mapping[str, AttrValue]) -> Span:
        """A started span for ``name``: the workflow, stage or tool name (the adapter adds the kind)."""


class NoSpan:
    """A span that records nothing."""

    __slots__ = ()

    def set(self, key: str, value: AttrValue) -> None:
        pass

    def end(self, error: BaseException | None = None) -> None:
        pass


_NO_SPAN = NoSpan()


class _NoTrace:
    __slots__ = ()

    def start(self, kind: SpanKind, name: str, parent: Span | None,
              attributes: Mapping[str, AttrValue]) -> Span:
        return _NO_SPAN


NO_TRACE: Tracer = _NoTrace()
"""The default tracer: no spans."""


def context_of(span: Span) -> TraceContext | None:
    """The W3C trace context a span gives the records written under it (its ``trace_context``
    attribute, which ``runlog.producers.otel.OtelSpan`` has), or None: a span without one (``NoSpan``)
    puts no ``traceparent`` on the records."""
    ctx = getattr(span, "trace_context", None)
    return ctx if isinstance(ctx, TraceContext) else None
