"""Reading one run's history from the log, and drawing it as a terminal timeline."""

from __future__ import annotations

from dataclasses import dataclass

from projections import Outcome, OutcomeKind, RunState, fold, run_events
from schemas import EventType, RunEvent, Settings, Topics, partition_for

__all__ = ["LoggedEvent", "partitions_of", "render_timeline", "run_history"]


@dataclass(frozen=True)
class LoggedEvent:
    """One event of a run as the log holds it, with the fold's verdict."""

    offset: int
    event: RunEvent
    outcome: Outcome
    state: RunState


def partitions_of(settings: Settings) -> int:
    from confluent_kafka.admin import AdminClient

    topic = Topics.of(settings).events
    md = AdminClient(settings.admin_config()).list_topics(topic, timeout=10)
    return len(md.topics[topic].partitions) if topic in md.topics else settings.partitions


def run_history(settings: Settings, run_id: str, *, upto_seq: int | None = None,
                upto_time_ms: int | None = None) -> list[LoggedEvent]:
    """Every event of a run in log order, folded; optionally only up to a seq or a time."""
    partition = partition_for(run_id, partitions_of(settings))
    state: RunState | None = None
    out: list[LoggedEvent] = []
    for offset, ev in run_events(settings, run_id, partition, 0):
        if upto_time_ms is not None and ev.occurred_at > upto_time_ms:
            break
        state, outcome = fold(state, ev, (partition, offset))
        assert state is not None
        out.append(LoggedEvent(offset, ev, outcome, state))
        if upto_seq is not None and outcome.kind is OutcomeKind.ACCEPTED and ev.seq >= upto_seq:
            break
    return out


_MARK = {
    EventType.RUN_STARTED: "●", EventType.LEASE_ACQUIRED: "⚷", EventType.STAGE_STARTED: "▶",
    EventType.TOOL_CALLED: "→", EventType.TOOL_RESULT: "←", EventType.EFFECT_INTENT: "!",
    EventType.EFFECT_RESULT: "✓", EventType.EFFECT_RECONCILED: "≈", EventType.VERIFIED: "■",
    EventType.FAILED: "✗", EventType.RUN_BLOCKED: "⛔", EventType.RUN_COMPLETED: "◆",
    EventType.RUN_BRANCHED: "⑂", EventType.CALL_DIVERGED: "≠",
}


def render_timeline(history: list[LoggedEvent]) -> str:
    """A run's events as lines: seq, epoch, mark, type, stage and what matters about each."""
    lines = []
    for le in history:
        e = le.event
        bits = []
        if e.call_id:
            bits.append(e.call_id)
        if e.replay_policy:
            bits.append(e.replay_policy.value)
        if e.external_id:
            bits.append(f"external_id={e.external_id}")
        if e.delivery_key and e.type in (EventType.EFFECT_INTENT, EventType.EFFECT_RECONCILED):
            bits.append(f"dk={e.delivery_key[:12]}")
        if e.type is EventType.VERIFIED:
            bits.append(f"{len(e.artifact_refs)} artifacts, rules: "
                        + ", ".join(r.rule for r in e.verification))
        if e.error is not None:
            bits.append(f"{e.error.kind}: {e.error.message}")
        if le.outcome.kind is not OutcomeKind.ACCEPTED:
            bits.append(f"[{le.outcome.kind.value}: {le.outcome.reason}]")
        stage = e.stage or ""
        lines.append(f"{e.seq:>5} e{e.epoch:<2} {_MARK.get(e.type, '?')} {e.type.value:<17} "
                     f"{stage:<9} {' '.join(bits)}".rstrip())
    return "\n".join(lines)
