"""Spans of Runlog's processors: the resumer, the operator commands and the projector.

:class:`Tracing` is on when ``Settings.tracing`` (``RUNLOG_TRACING``, default true) is and
OpenTelemetry is installed (the ``otel`` extra); otherwise every span it opens is a
:class:`~runlog.producers.base._trace.NoSpan` and nothing else happens (no import, no headers). Spans go
to the tracer provider passed in, else the global one (``opentelemetry.trace.set_tracer_provider``,
which Logfire's ``logfire.configure()`` or ``opentelemetry-instrument`` set): any exporter works.

:meth:`Tracing.span` makes its span current (OpenTelemetry's context, so the runner's run span of
a resume nests under it) and its W3C context the one records written meanwhile carry
(:func:`runlog.schemas._tracecontext.carrying`): an operator's events and resume requests, a resume's
``LEASE_ACQUIRED``. Attributes are identifiers only (run id, epoch, outcome), prefixed ``runlog.``;
a failed span records the exception's type, never its message.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal

from runlog.producers.internal import NO_TRACE, AttrValue, NoSpan, Span, Tracer, context_of
from runlog.schemas.internal import TraceContext, carrying, current
from runlog.schemas.settings import Settings

if TYPE_CHECKING:
    from runlog.producers.otel import OtelTracer

__all__ = ["OPERATOR_COMMANDS", "Tracing", "command_span"]

OPERATOR_COMMANDS = frozenset({"resume", "resolve", "cancel", "retry", "signal", "approve", "reject",
                               "upgrade", "branch"})
"""The ``runlog`` commands that act on runs: each is a span ``runlog <command>``."""


class Tracing:
    """Where a processor's spans go.

    Args:
        settings: ``settings.tracing`` False turns every span off.
        tracer_provider: an OpenTelemetry ``TracerProvider``; None: the global one.
    """

    def __init__(self, settings: Settings | None = None, tracer_provider: Any = None) -> None:
        self._otel: OtelTracer | None = None
        if settings is None or settings.tracing:
            try:
                from runlog.producers.otel import OtelTracer
            except ImportError:  # the otel extra is not installed: nothing is traced
                return
            self._otel = OtelTracer(tracer_provider)

    @property
    def enabled(self) -> bool:
        return self._otel is not None

    @property
    def recording(self) -> bool:
        """Enabled, and its provider can record (see ``OtelTracer.configured``): the projector reads
        its records' trace contexts only then."""
        return self._otel is not None and self._otel.configured

    def runner_tracer(self) -> Tracer:
        """The runner's tracer (run, stage and call spans) on the same provider, or ``NO_TRACE``."""
        return self._otel if self._otel is not None else NO_TRACE

    def start(self, name: str, *, links: Iterable[TraceContext | None] = (),
              attributes: Mapping[str, AttrValue] | None = None,
              kind: Literal["internal", "consumer", "client"] = "internal") -> Span:
        """A span (not made current; the caller ends it) linked to each distinct context of ``links``."""
        if self._otel is None:
            return NoSpan()
        return self._otel.start_span(name, links=[x for x in links if x is not None], attributes=attributes,
                                     kind=kind)

    @contextmanager
    def span(self, name: str, *, parent: TraceContext | None = None,
             links: Iterable[TraceContext | None] = (), attributes: Mapping[str, AttrValue] | None = None,
             kind: Literal["internal", "consumer", "client"] = "internal") -> Iterator[Span]:
        """A span for the block: its parent ``parent`` (a recorded context), else the current span;
        linked to every other context in ``links``; current, and carried by records, in the block.
        An exception leaving the block marks it failed (its type only) and propagates."""
        if self._otel is None:
            yield NoSpan()
            return
        from opentelemetry import context as otel_context

        span = self._otel.start_span(name, parent=parent, links=[x for x in links if x is not None],
                                     attributes=attributes, kind=kind)
        token = otel_context.attach(span.context)
        try:
            with carrying(context_of(span) or parent or current()):
                yield span
        except BaseException as err:
            span.end(err)
            raise
        finally:
            otel_context.detach(token)
            span.end()


@contextmanager
def command_span(args: argparse.Namespace, tracer_provider: Any = None) -> Iterator[None]:
    """The span of an operator command (:data:`OPERATOR_COMMANDS`, none for the others): named
    ``runlog <command>``, attributes ``command`` and ``run_id``; the events it appends and the resume
    requests it sends carry its context."""
    command = getattr(args, "command", None)
    if command not in OPERATOR_COMMANDS:
        yield
        return
    run_id = getattr(args, "run_id", None)
    attributes: dict[str, AttrValue] = {"command": str(command)}
    if isinstance(run_id, str):
        attributes["run_id"] = run_id
    with Tracing(Settings.from_env(), tracer_provider).span(f"runlog {command}", attributes=attributes):
        yield
