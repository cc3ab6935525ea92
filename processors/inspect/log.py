"""A run's history read from the log for the operator views: each event with the fold's verdict
(:class:`LoggedEvent`), one run's events up to a seq or a time, and every run's state folded
from the whole topic (for ``runlog runs`` when no projector has written Redis)."""

from __future__ import annotations

from dataclasses import dataclass

from runlog.projections import Outcome, OutcomeKind, RunState, fold
from runlog.schemas import RunEvent, Settings, partition_for
from runlog.schemas.internal import partitions_of

__all__ = ["LoggedEvent", "partitions_of", "run_history", "runs_from_log"]


@dataclass(frozen=True)
class LoggedEvent:
    """One event of a run as the log holds it, with the fold's verdict."""

    offset: int
    event: RunEvent
    outcome: Outcome
    state: RunState


def run_history(settings: Settings, run_id: str, *, upto_seq: int | None = None,
                upto_time_ms: int | None = None) -> list[LoggedEvent]:
    """Every event of a run in log order, folded; optionally only up to a seq or a time."""
    from runlog.projections.log_reader import read_run_records

    partition = partition_for(run_id, partitions_of(settings))
    state: RunState | None = None
    out: list[LoggedEvent] = []
    for offset, ev, h in read_run_records(settings, run_id, partition):
        if upto_time_ms is not None and ev.occurred_at > upto_time_ms:
            break
        state, outcome = fold(state, ev, (partition, offset), content_hash=h)
        assert state is not None
        out.append(LoggedEvent(offset, ev, outcome, state))
        if upto_seq is not None and outcome.kind is OutcomeKind.ACCEPTED and ev.seq >= upto_seq:
            break
    return out


def runs_from_log(settings: Settings) -> dict[str, RunState]:
    """Every run on the events topic folded from its first event (what a projector would write to
    Redis): for ``runlog runs`` when no projector has run. Reads the whole topic once
    (:func:`runlog.projections.log_reader.read_topic`); undecodable and mis-keyed records are the
    projector's dead letters, skipped."""
    from runlog.projections.log_reader import read_topic
    from runlog.schemas import Codec, DecodeError, event_hash

    codec = Codec.from_settings(settings)
    states: dict[str, RunState] = {}
    for batch in read_topic(settings):
        for m in batch:
            key, value = m.key(), m.value()
            if value is None:
                continue
            try:
                ev, body = codec.decode_with_body(value, RunEvent)
            except DecodeError:
                continue
            if key is not None and key != ev.run_id.encode("utf-8"):
                continue
            states[ev.run_id], _ = fold(states.get(ev.run_id), ev, (m.partition(), m.offset()),
                                        content_hash=event_hash(ev, body))
    return states
