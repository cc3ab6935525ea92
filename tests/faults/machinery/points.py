"""Crash points of a run, enumerated from a reference run's log (pure: no services).

A point names where a worker SIGKILLs itself (see :mod:`runlog.producers.crash`):
``before:<TYPE>:<subject>`` / ``after:<TYPE>:<subject>`` for every event,
``inside:STAGE:<stage>`` for every stage and ``inside:TOOL:<call_id>`` for
every tool call. The subject of an event is its ``call_id``, else its
``stage``, else ``run``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from runlog.schemas import EventType, RunEvent

__all__ = ["Boundary", "boundaries", "crash_points", "expected_prefix", "subject_of"]


@dataclass(frozen=True, slots=True)
class Boundary:
    """One event of the reference run, reduced to what names a crash point."""

    type: EventType
    stage: str | None
    call_id: str | None

    @property
    def subject(self) -> str:
        return self.call_id or self.stage or "run"

    @property
    def label(self) -> str:
        return f"{self.type.value}:{self.subject}"


def subject_of(ev: RunEvent) -> str:
    return ev.call_id or ev.stage or "run"


def boundaries(events: Sequence[RunEvent]) -> list[Boundary]:
    return [Boundary(e.type, e.stage, e.call_id) for e in events]


def crash_points(events: Sequence[Boundary]) -> list[str]:
    """Every point of a run in log order: before/after each event, inside each stage and call."""
    out: list[str] = []
    for b in events:
        out.append(f"before:{b.label}")
        out.append(f"after:{b.label}")
        if b.type is EventType.STAGE_STARTED and b.stage:
            out.append(f"inside:STAGE:{b.stage}")
        if b.type is EventType.TOOL_CALLED and b.call_id and not _has_intent(events, b.call_id):
            out.append(f"inside:TOOL:{b.call_id}")
        if b.type is EventType.EFFECT_INTENT and b.call_id:
            out.append(f"inside:TOOL:{b.call_id}")
    if len(set(out)) != len(out):
        raise ValueError("the reference log names one crash point twice")
    return out


def _has_intent(events: Sequence[Boundary], call_id: str) -> bool:
    return any(b.type is EventType.EFFECT_INTENT and b.call_id == call_id for b in events)


def expected_prefix(point: str, events: Sequence[Boundary]) -> int:
    """How many of the reference run's events the log holds when a worker dies at ``point``.

    ``before:X`` keeps the events before X, ``after:X`` includes X, ``inside:STAGE:s`` ends
    with s's ``STAGE_STARTED``, ``inside:TOOL:c`` with c's ``EFFECT_INTENT`` when it has
    one, else its ``TOOL_CALLED`` (the hook fires after the intent is confirmed).
    """
    when, what, subject = point.split(":", 2)
    if when == "inside":
        want = (EventType.STAGE_STARTED,) if what == "STAGE" else (EventType.EFFECT_INTENT,
                                                                  EventType.TOOL_CALLED)
        for t in want:
            for i, b in enumerate(events):
                if b.type is t and b.subject == subject:
                    return i + 1
        raise ValueError(f"no boundary for {point!r}")
    for i, b in enumerate(events):
        if b.type.value == what and b.subject == subject:
            return i if when == "before" else i + 1
    raise ValueError(f"no boundary for {point!r}")
