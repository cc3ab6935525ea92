"""The one fold: a run's state plus its next event gives its new state (pure, no I/O, no drivers).

Acceptance (the same rule wherever a run is folded): an event is accepted when
``seq == last_seq + 1`` and ``epoch >= epoch`` so far (``LEASE_ACQUIRED`` needs
a strictly higher epoch); a repeat of an accepted ``(seq, content)`` still in
the recent window is a duplicate; a record at or before the last folded log
position is a redelivery (also a duplicate); anything else is rejected, counted
by reason and kept (boundedly) for audits. Memory is bounded: the digest window,
the rejected list and the checkpoint list have fixed sizes, and the calls of a
stage are dropped once it is verified (its checkpoint snapshot keeps them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from runlog.projections._budget import BUDGET_SIGNAL
from runlog.projections._fold_operators import budget_of, raised
from runlog.projections._fold_operators import effect as _effect
from runlog.projections._fold_operators import fingerprints as _fingerprints
from runlog.projections._fold_operators import resolved as _resolved
from runlog.projections._fold_operators import spent as _spent
from runlog.projections._fold_operators import update_call as _update_call
from runlog.projections._fold_operators import upgraded as _upgraded
from runlog.projections._fold_outcome import (
    _ACCEPTED,
    CHECKPOINT_WINDOW,
    DIGEST_WINDOW,
    REJECTED_WINDOW,
    LimitUse,
    Outcome,
    OutcomeKind,
    Position,
)
from runlog.projections._state import (
    CallRecord,
    CallStatus,
    CheckpointEntry,
    RejectedEvent,
    RunState,
    RunStatus,
    WaitInfo,
    evolve_state,
)
from runlog.projections._usage import CHILD_USAGE_ATTRIBUTE, INHERITED_ATTRIBUTE, inherited_from, totals_from
from runlog.schemas import Checkpoint, EffectStatus, EventType, RunEvent, event_hash
from runlog.schemas.internal import (
    CHILD_RUN_ATTRIBUTE,
    CHILD_TOOL,
    CHILDREN_ATTRIBUTE,
    PARENT_CALL_ATTRIBUTE,
    SUBJECT_ATTRIBUTE,
    TRACEPARENT,
    TRACESTATE,
)

__all__ = [
    "CHECKPOINT_WINDOW",
    "DIGEST_WINDOW",
    "REJECTED_WINDOW",
    "Outcome",
    "OutcomeKind",
    "Position",
    "event_digest",
    "fold",
    "fold_all",
    "fold_many",
]

LABELS = ("queue", "tenant", "priority")
"""The ``RUN_STARTED`` attributes ``runlog.<label>`` a submitted run carries (:attr:`RunState.labels`)."""


def labels_of(attributes: Mapping[str, str]) -> dict[str, str]:
    """A run's labels from its ``RUN_STARTED`` attributes (:data:`LABELS`)."""
    return {k: attributes[f"runlog.{k}"] for k in LABELS if f"runlog.{k}" in attributes}


def event_digest(event: RunEvent, body: bytes | None = None) -> str:
    """The duplicate window's digest: the first 128 bits of ``event_hash``, so every field counts.

    A writer retry re-sends identical content, ``prev_hash`` included, so a retry has the same
    digest; the fold computes ``event_hash`` once per event and uses it both here and as ``last_hash``.
    ``body``: the event's Avro body as received (see :func:`fold`'s ``content_hash``).
    """
    return event_hash(event, body)[:32]


def _reject(
    state: RunState, event: RunEvent, kind: OutcomeKind, reason: str, position: Position | None
) -> tuple[RunState, Outcome]:
    counts = dict(state.rejected)
    counts[reason] = counts.get(reason, 0) + 1
    off = position[1] if position is not None else -1
    recent = (*state.recent_rejected, RejectedEvent(event.seq, event.epoch, event.type.value, reason, off))
    new = evolve_state(
        state,
        rejected=counts,
        recent_rejected=recent[-REJECTED_WINDOW:],
        partition=position[0] if position is not None else state.partition,
        offset=off if position is not None else state.offset,
    )
    return new, Outcome(kind, reason)


def fold(
    state: RunState | None, event: RunEvent, position: Position | None = None, *,
    content_hash: str | None = None,
) -> tuple[RunState, Outcome]:
    """Fold one event into a run's state.

    Args:
        state: the run's state so far, or None before its first event.
        event: the next event of this run, in log order.
        position: (partition, offset) of the event's record, when read from Kafka; makes
            redelivery of any record (rejected ones included) a no-op.
        content_hash: the event's hash as its record was read, ``event_hash(event, body)`` with the
            body from :meth:`runlog.schemas.Codec.decode_with_body`: every reader of the log passes it.
            None: ``event_hash(event)``, which for a version-2 event encodes it with the current
            schema (right for events written with it: in-memory paths, tests).

    Returns:
        The new state (the same object on a duplicate) and what happened.
    """
    if state is None:
        state = RunState(run_id=event.run_id)
    elif state.run_id != event.run_id:
        raise ValueError(f"event of run {event.run_id!r} folded into run {state.run_id!r}")
    if (
        position is not None
        and state.partition == position[0]
        and position[1] <= state.offset
    ):
        return state, Outcome(OutcomeKind.DUPLICATE, "redelivered")
    if content_hash is None:
        content_hash = event_hash(event)
    digest = content_hash[:32]
    if event.seq <= state.last_seq:
        for seq, d in state.recent:
            if seq == event.seq and d == digest:
                return state, Outcome(OutcomeKind.DUPLICATE, "same_content")
    if event.epoch < state.epoch:
        return _reject(state, event, OutcomeKind.REJECTED_FENCED, "stale_epoch", position)
    if event.type is EventType.LEASE_ACQUIRED and event.epoch <= state.epoch:
        return _reject(state, event, OutcomeKind.REJECTED_FENCED, "lease_epoch_not_higher", position)
    if event.seq != state.last_seq + 1:
        reason = "seq_gap" if event.seq > state.last_seq else "seq_replayed"
        return _reject(state, event, OutcomeKind.REJECTED_OUT_OF_ORDER, reason, position)
    accepted = {
        "last_seq": event.seq,
        "epoch": event.epoch,
        "updated_at": event.occurred_at,
        "recent": (*state.recent, (event.seq, digest))[-DIGEST_WINDOW:],
        "last_hash": content_hash,
        "partition": position[0] if position is not None else state.partition,
        "offset": position[1] if position is not None else state.offset,
    }
    # The events of a stage's loop (most of a log) take the accepted event's fields and their own
    # change in one copy of the state; every other event takes them first, then the state machine.
    t = event.type
    if state.status is not RunStatus.CANCELLED:
        if t is EventType.STAGE_STARTED:
            return evolve_state(state, **accepted, stage=event.stage, status=RunStatus.RUNNING), _ACCEPTED
        if t is EventType.TOOL_CALLED and event.call_id is not None:
            if event.tool == CHILD_TOOL:
                return evolve_state(state, **accepted, calls=_called(state, event),
                                    children=_child_of(state, event)), _ACCEPTED
            return evolve_state(state, **accepted, calls=_called(state, event)), _ACCEPTED
        if t is EventType.TOOL_RESULT and event.call_id is not None:
            s = _update_call(state, event, CallStatus.RESULT, event.payload_ref, accepted)
            if event.tool == CHILD_TOOL:
                s = _child_spent(s, event)
            s, out = _spent(s, event) if event.usage is not None else (s, _ACCEPTED)
            return s, _limited(out, event)
    s, out = _apply(evolve_state(state, **accepted), event, position)
    return s, _limited(out, event) if t in (EventType.TOOL_RESULT, EventType.RUN_WAITING) else out


def _limited(out: Outcome, e: RunEvent) -> Outcome:
    """``out`` with what an accepted event says of a call's rate limit (:class:`LimitUse`), if anything."""
    a = e.attributes
    key = a.get("limit")
    if not key or not out.accepted:
        return out
    if e.type is EventType.RUN_WAITING:
        return replace(out, limit=LimitUse(key, parked=True)) if a.get("signal") == "runlog.limit" else out
    waited, refused = a.get("limit_wait_ms", "0"), a.get("rate_limited", "0")
    return replace(out, limit=LimitUse(key, int(waited) if waited.isdigit() else 0,
                                       int(refused) if refused.isdigit() else 0))


def _child_spent(s: RunState, e: RunEvent) -> RunState:
    """``s`` with the spend of the child whose outcome ``e`` records (attribute ``runlog.usage.child``),
    once per child."""
    child = e.attributes.get(CHILD_RUN_ATTRIBUTE)
    spent = totals_from(e.attributes, CHILD_USAGE_ATTRIBUTE)
    if not child or spent is None or child in s.children_usage:
        return s
    return evolve_state(s, children_usage={**s.children_usage, child: spent})


def _child_of(s: RunState, e: RunEvent) -> tuple[str, ...]:
    """The children of ``s`` with the one a child call's ``TOOL_CALLED`` names (once)."""
    child = e.attributes.get(CHILD_RUN_ATTRIBUTE)
    return s.children if not child or child in s.children else (*s.children, child)


def _called(s: RunState, e: RunEvent) -> dict[str, CallRecord]:
    """The calls of ``s`` with the call ``TOOL_CALLED`` ``e`` records (its ``call_id`` is set)."""
    assert e.call_id is not None
    call = CallRecord(
        call_id=e.call_id, tool=e.tool, policy=e.replay_policy, status=CallStatus.CALLED,
        stage=e.stage or s.stage, seq=e.seq, args=e.payload_ref,
        idempotency_key=e.idempotency_key, delivery_key=e.delivery_key,
        request_hash=e.request_hash,
    )
    return {**s.calls, e.call_id: call}


def _apply(s: RunState, e: RunEvent, pos: Position | None) -> tuple[RunState, Outcome]:
    """The state machine proper, for an accepted event (``s`` already carries its seq and epoch).
    :func:`fold` applies ``STAGE_STARTED``, ``TOOL_CALLED`` and ``TOOL_RESULT`` itself (the same
    branches as here, in one copy), unless the run is cancelled."""
    t = e.type
    if s.status is RunStatus.CANCELLED:
        # Terminal: an event accepted after RUN_CANCELLED (a later epoch's LEASE_ACQUIRED, say)
        # holds its seq and changes nothing else; older epochs' events are fenced anyway. Except an
        # operator's decision of an effect it left in doubt, which closes the effect (the run stays
        # cancelled), so the delivery key is no longer in doubt for every other run.
        if t is EventType.EFFECT_RESOLVED and e.delivery_key is not None:
            return _resolved(s, e)
        return s, _ACCEPTED
    if t is EventType.RUN_BRANCHED and INHERITED_ATTRIBUTE in e.attributes:
        s = evolve_state(s, inherited_usage=inherited_from(e.attributes))  # the parent's at the fork
    if t in (EventType.RUN_STARTED, EventType.RUN_BRANCHED):
        wf = e.workflow if e.workflow is not None else s.workflow
        s = evolve_state(
            s,
            status=RunStatus.RUNNING,
            workflow=wf,
            input_versions=dict(e.input_versions) if e.input_versions else s.input_versions,
            started_at=s.started_at or e.occurred_at,
            params_ref=e.payload_ref if t is EventType.RUN_STARTED else s.params_ref,
            parent_run_id=e.parent_run_id if e.parent_run_id is not None else s.parent_run_id,
            forked_from_seq=e.forked_from_seq if e.forked_from_seq is not None else s.forked_from_seq,
            next_stage=s.next_stage if s.completed_stages or wf is None else wf.next_stage(None),
            stage_fingerprints=_fingerprints(e) or s.stage_fingerprints,
            traceparent=e.attributes.get(TRACEPARENT) or s.traceparent,
            tracestate=e.attributes.get(TRACESTATE) if TRACEPARENT in e.attributes else s.tracestate,
            usage_budget=budget_of(e) or s.usage_budget,
            labels=labels_of(e.attributes) or s.labels,
            subject=e.attributes.get(SUBJECT_ATTRIBUTE) or s.subject,
            parent_call=e.attributes.get(PARENT_CALL_ATTRIBUTE) or s.parent_call,
        )
        return s, _ACCEPTED
    if t is EventType.RUN_UPGRADED and e.workflow is not None:
        return _upgraded(s, e, pos)
    if t is EventType.LEASE_ACQUIRED:
        if s.status is not RunStatus.COMPLETED:
            s = evolve_state(s, status=RunStatus.RUNNING)
        return s, _ACCEPTED
    if t is EventType.STAGE_STARTED:
        return evolve_state(s, stage=e.stage, status=RunStatus.RUNNING), _ACCEPTED
    if t is EventType.TOOL_CALLED and e.call_id is not None:
        return evolve_state(s, calls=_called(s, e)), _ACCEPTED
    if t is EventType.TOOL_RESULT and e.call_id is not None:
        s = _update_call(s, e, CallStatus.RESULT, e.payload_ref)
        if e.tool == CHILD_TOOL:
            s = _child_spent(s, e)
        return _spent(s, e) if e.usage is not None else (s, _ACCEPTED)
    if t is EventType.EFFECT_INTENT and e.delivery_key is not None:
        return _effect(s, e, EffectStatus.INTENT)
    if t in (EventType.EFFECT_RESULT, EventType.EFFECT_RECONCILED) and e.delivery_key is not None:
        done = EffectStatus.DONE if t is EventType.EFFECT_RESULT else EffectStatus.RECONCILED
        s2, out = _effect(s, e, done)
        if t is EventType.EFFECT_RECONCILED and e.call_id is not None and e.payload_ref is not None:
            s2 = _update_call(s2, e, CallStatus.RESULT, e.payload_ref)
        return s2, out
    if t is EventType.VERIFIED:
        return _verified(s, e, pos)
    if t is EventType.FAILED:
        if e.call_id is not None:
            # a failed tool call fails its stage (the runner raises it even if stage code swallowed it)
            s = _update_call(s, e, CallStatus.FAILED, None)
            s = evolve_state(s, status=RunStatus.FAILED, last_error=e.error, stage=e.stage or s.stage)
            if e.delivery_key is not None and e.delivery_key in s.open_effects:
                return _effect(s, e, EffectStatus.FAILED)
            return s, _ACCEPTED
        s = evolve_state(s, status=RunStatus.FAILED, last_error=e.error, stage=e.stage or s.stage)
        return s, _ACCEPTED
    if t is EventType.RUN_BLOCKED:
        return evolve_state(s, status=RunStatus.BLOCKED, last_error=e.error), _ACCEPTED
    if t is EventType.RUN_WAITING and e.call_id is not None:
        deadline = e.attributes.get("deadline_ms", "0")
        children = tuple(c for c in e.attributes.get(CHILDREN_ATTRIBUTE, "").split(",") if c)
        since = e.attributes.get("since_ms", "0")
        wait = WaitInfo(e.call_id, e.attributes.get("signal", ""), int(deadline) if deadline.isdigit() else 0,
                        children, int(since) if since.isdigit() else 0)
        return evolve_state(s, status=RunStatus.WAITING, waiting=wait, stage=e.stage or s.stage), _ACCEPTED
    if t is EventType.SIGNAL_RECEIVED and e.attributes.get("signal") == BUDGET_SIGNAL:
        return raised(s, e), _ACCEPTED  # new caps, not a call's result
    if t is EventType.SIGNAL_RECEIVED and e.call_id is not None and e.payload_ref is not None:
        # the signal's data is the wait's recorded result; the run goes on when a resumer takes it
        s = _update_call(s, e, CallStatus.RESULT, e.payload_ref)
        if e.tool == CHILD_TOOL:
            s = _child_spent(s, e)
        status = RunStatus.RUNNING if s.status is RunStatus.WAITING else s.status
        return evolve_state(s, waiting=None, status=status), _ACCEPTED
    if t is EventType.RUN_COMPLETED:
        return evolve_state(s, status=RunStatus.COMPLETED, stage=None, next_stage=None), _ACCEPTED
    if t is EventType.EFFECT_RESOLVED and e.delivery_key is not None:
        return _resolved(s, e)
    if t is EventType.RUN_CANCELLED and s.status is not RunStatus.COMPLETED:
        return evolve_state(s, status=RunStatus.CANCELLED, last_error=e.error or s.last_error), _ACCEPTED
    # UNKNOWN (a newer schema's type) or a malformed event: it holds its seq, nothing more.
    return s, _ACCEPTED


def _verified(s: RunState, e: RunEvent, pos: Position | None) -> tuple[RunState, Outcome]:
    stage = e.stage or s.stage
    if stage is None or not all(r.passed for r in e.verification):
        # Rule 2: a stage whose rules did not all pass yields no checkpoint.
        return s, Outcome(OutcomeKind.ACCEPTED, "verification_not_passed")
    arts = {a.uri: a for a in s.verified_artifacts}
    for a in e.artifact_refs:
        arts.pop(a.uri, None)
        arts[a.uri] = a
    outputs = dict(s.stage_outputs)
    if e.payload_ref is not None:
        outputs[stage] = e.payload_ref
    done = s.completed_stages if stage in s.completed_stages else (*s.completed_stages, stage)
    nxt = s.workflow.next_stage(stage) if s.workflow is not None else None
    wants_cp = True
    if s.workflow is not None and stage in s.workflow.stage_names:
        wants_cp = s.workflow.stage(stage).checkpoint
    if not wants_cp:
        # No checkpoint: resume runs this stage again from the previous one, so its recorded
        # calls stay (reused on that re-run, and what the determinism guard compares with).
        s = evolve_state(s, stage=None, next_stage=nxt, verified_artifacts=tuple(arts.values()),
                    stage_outputs=outputs, completed_stages=done)
        return s, _ACCEPTED
    # Finished calls of the stages this checkpoint covers are no longer needed by resume (the
    # snapshot keeps them).
    calls = {k: c for k, c in s.calls.items() if c.stage not in done or c.status is CallStatus.CALLED}
    s = evolve_state(
        s, stage=None, next_stage=nxt, verified_artifacts=tuple(arts.values()),
        stage_outputs=outputs, completed_stages=done, calls=calls,
    )
    part, off = pos if pos is not None else (-1, -1)
    cp = Checkpoint(
        checkpoint_id=f"{s.run_id}:{e.seq}",
        run_id=s.run_id,
        last_seq=e.seq,
        partition=part,
        offset=off,
        stage=stage,
        created_at=e.occurred_at,
        inputs=dict(s.input_versions),
        artifacts=s.verified_artifacts,
        verified_by=e.verification,
        next_stage=nxt,
        workflow_version=s.workflow_version,
    )
    entry = CheckpointEntry(cp.checkpoint_id, stage, e.seq, part, off, s.last_hash)  # s: as of e
    s = evolve_state(s, checkpoint=cp, checkpoints=(*s.checkpoints, entry)[-CHECKPOINT_WINDOW:])
    return s, Outcome(OutcomeKind.ACCEPTED, checkpoint=cp)


Item = RunEvent | tuple[RunEvent, Position | None] | tuple[RunEvent, Position | None, str | None]
"""What :func:`fold_all` and :func:`fold_many` take: an event, ``(event, position)``, or
``(event, position, content_hash)`` (as :func:`runlog.projections.batch.decode_records` gives)."""


def _unpack(item: Item) -> tuple[RunEvent, Position | None, str | None]:
    if not isinstance(item, tuple):
        return item, None, None
    if len(item) == 2:
        return item[0], item[1], None
    return item


def fold_all(events: Iterable[Item], state: RunState | None = None) -> RunState | None:
    """Fold one run's events (optionally with positions and hashes) in order; None when there are
    none."""
    for item in events:
        ev, pos, h = _unpack(item)
        state, _ = fold(state, ev, pos, content_hash=h)
    return state


def fold_many(events: Iterable[Item], states: Mapping[str, RunState] | None = None) -> dict[str, RunState]:
    """Fold an interleaving of many runs' events; returns each run's state."""
    out: dict[str, RunState] = dict(states or {})
    for item in events:
        ev, pos, h = _unpack(item)
        out[ev.run_id], _ = fold(out.get(ev.run_id), ev, pos, content_hash=h)
    return out
