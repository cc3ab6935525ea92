"""W3C trace context (``traceparent``, ``tracestate``) as Runlog's records carry it (pure, no
OpenTelemetry needed).

A record written while a trace is active carries two more Kafka headers, the W3C Trace Context
ones that OpenTelemetry's Kafka instrumentations read and the CloudEvents distributed-tracing
extension names (``traceparent`` and ``tracestate``; ``tracestate`` only when not empty). A run
records the context it started in as ``RUN_STARTED`` attributes of the same names, so a process
resuming it later continues the run's trace (the fold keeps them: ``RunState.traceparent``).

:class:`TraceContext` holds one validated context with its headers encoded once; the writer adds
them to a record as they are (nothing is formatted per event). :func:`current` is the context the
records written on this thread or task carry when no run span gives one: Runlog's processors set
it (:func:`carrying`) around the work a span of theirs covers (a resume, an operator command).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TRACEPARENT", "TRACESTATE", "TraceContext", "carrying", "current", "distinct_contexts",
           "from_attributes", "from_headers", "parse"]

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
_CE_TRACEPARENT = "ce_traceparent"
_CE_TRACESTATE = "ce_tracestate"
_MAX_TRACESTATE = 512
"""W3C: a tracestate may be cut to 512 characters; a longer one is dropped, not cut mid-member."""
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[^\s]*)?")
_TRACESTATE = re.compile(r"[\x20-\x7e]*")


@dataclass(frozen=True, slots=True)
class TraceContext:
    """One W3C trace context: ``traceparent`` (validated by :func:`parse`) and ``tracestate``."""

    traceparent: str
    tracestate: str = ""
    headers: tuple[tuple[str, bytes], ...] = field(init=False, repr=False, compare=False)
    """The Kafka headers that carry it, encoded once."""

    def __post_init__(self) -> None:
        h = [(TRACEPARENT, self.traceparent.encode("ascii"))]
        if self.tracestate:
            h.append((TRACESTATE, self.tracestate.encode("ascii")))
        object.__setattr__(self, "headers", tuple(h))

    @property
    def trace_id(self) -> str:
        """32 lowercase hex digits."""
        return self.traceparent[3:35]

    @property
    def span_id(self) -> str:
        """16 lowercase hex digits: the span the context names (the parent of what continues it)."""
        return self.traceparent[36:52]

    @property
    def sampled(self) -> bool:
        return bool(int(self.traceparent[53:55], 16) & 1)

    def attributes(self) -> dict[str, str]:
        """As event attributes (``RUN_STARTED``): ``traceparent`` and, when not empty, ``tracestate``."""
        return {TRACEPARENT: self.traceparent, **({TRACESTATE: self.tracestate} if self.tracestate else {})}


def parse(traceparent: str | bytes | None, tracestate: str | bytes | None = None) -> TraceContext | None:
    """A valid ``traceparent`` (and its ``tracestate``) as a :class:`TraceContext`, else None.

    Valid as W3C Trace Context says: ``version-traceid-spanid-flags`` in lowercase hex, version not
    ``ff`` (version ``00`` exactly 55 characters, a later version may append fields), neither id all
    zeros. A ``tracestate`` longer than 512 characters or holding non-printable characters is
    dropped (the context is kept)."""
    if traceparent is None:
        return None
    try:
        tp = traceparent.decode("ascii") if isinstance(traceparent, bytes) else traceparent
        ts = (tracestate.decode("ascii") if isinstance(tracestate, bytes) else tracestate) or ""
    except UnicodeDecodeError:
        return None
    tp = tp.strip()
    m = _TRACEPARENT.fullmatch(tp)
    if m is None:
        return None
    version, trace_id, span_id, _, rest = m.groups()
    if version == "ff" or (version == "00" and rest) or set(trace_id) == {"0"} or set(span_id) == {"0"}:
        return None
    ts = ts.strip()
    if len(ts) > _MAX_TRACESTATE or _TRACESTATE.fullmatch(ts) is None:
        ts = ""
    return TraceContext(tp if version == "00" else "00" + tp[2:55], ts)


def from_headers(headers: Iterable[tuple[str, str | bytes | None]] | Mapping[str, bytes] | None,
                 ) -> TraceContext | None:
    """The trace context of a record's headers (``traceparent``, else the CloudEvents binary-mode
    ``ce_traceparent``), or None when it carries no valid one."""
    if not headers:
        return None
    items = headers.items() if isinstance(headers, Mapping) else headers
    found: dict[str, str | bytes | None] = {}
    for k, v in items:
        if k in (TRACEPARENT, TRACESTATE, _CE_TRACEPARENT, _CE_TRACESTATE):
            found.setdefault(k, v)
    if TRACEPARENT in found:
        return parse(found[TRACEPARENT], found.get(TRACESTATE))
    return parse(found.get(_CE_TRACEPARENT), found.get(_CE_TRACESTATE))


_Headers = Iterable[tuple[str, str | bytes | None]] | Mapping[str, bytes] | None


def distinct_contexts(records: Iterable[_Headers]) -> list[TraceContext]:
    """The distinct valid trace contexts of many records' headers, in first-seen order; each distinct
    header value is parsed once (a run's records mostly share one)."""
    seen: dict[tuple[Any, Any], TraceContext | None] = {}
    for headers in records:
        if not headers:
            continue
        tp = ts = ce_tp = ce_ts = None
        for k, v in (headers.items() if isinstance(headers, Mapping) else headers):
            if k == TRACEPARENT:
                tp = v
            elif k == TRACESTATE:
                ts = v
            elif k == _CE_TRACEPARENT:
                ce_tp = v
            elif k == _CE_TRACESTATE:
                ce_ts = v
        key = (tp, ts) if tp is not None else (ce_tp, ce_ts)
        if key[0] is not None and key not in seen:
            seen[key] = parse(key[0], key[1])
    return [tc for tc in seen.values() if tc is not None]


def from_attributes(attributes: Mapping[str, str]) -> TraceContext | None:
    """The trace context recorded in event attributes (``RUN_STARTED``), or None."""
    return parse(attributes.get(TRACEPARENT), attributes.get(TRACESTATE))


_CURRENT: ContextVar[TraceContext | None] = ContextVar("runlog_trace_context", default=None)


def current() -> TraceContext | None:
    """The context records written here carry when nothing more specific gives one (None: none)."""
    return _CURRENT.get()


@contextmanager
def carrying(context: TraceContext | None) -> Iterator[None]:
    """Make ``context`` :func:`current` for the block (this thread or task only)."""
    token = _CURRENT.set(context)
    try:
        yield
    finally:
        _CURRENT.reset(token)
