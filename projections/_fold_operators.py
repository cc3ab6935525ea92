"""The fold's handling of operator events (``EFFECT_RESOLVED``, ``RUN_UPGRADED``) and the effect and call
records every event type updates (part of :mod:`runlog.projections.fold`; pure)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from runlog.projections._budget import BUDGET_ATTRIBUTE, BUDGET_SIGNAL, BudgetCaps
from runlog.projections._fold_outcome import _ACCEPTED, CHECKPOINT_WINDOW, Outcome, OutcomeKind, Position
from runlog.projections._state import (
    CallRecord,
    CallStatus,
    CheckpointEntry,
    EffectEntry,
    RunState,
    RunStatus,
    evolve_call,
    evolve_state,
)
from runlog.projections._usage import NO_USAGE
from runlog.schemas import ArtifactRef, Checkpoint, EffectStatus, ReplayPolicy, RunEvent
from runlog.schemas.internal import STAGES_ATTRIBUTE

__all__ = ["budget_of", "effect", "fingerprints", "raised", "resolved", "spent", "update_call", "upgraded"]


def budget_of(e: RunEvent) -> BudgetCaps | None:
    """The budget a ``RUN_STARTED`` records (None: none, or not a budget)."""
    raw = e.attributes.get(BUDGET_ATTRIBUTE)
    if not raw:
        return None
    try:
        return BudgetCaps.from_json(raw)
    except (ValueError, TypeError):
        return None


def raised(s: RunState, e: RunEvent) -> RunState:
    """A budget signal (``runlog budget``): the new caps; a run waiting at a cap goes on."""
    caps: BudgetCaps | None
    try:
        caps = (s.usage_budget or BudgetCaps()).raised(e.attributes)
    except (ValueError, TypeError):
        caps = s.usage_budget
    waiting = s.waiting if s.waiting is None or s.waiting.signal != BUDGET_SIGNAL else None
    status = RunStatus.RUNNING if s.status is RunStatus.WAITING and waiting is None else s.status
    return evolve_state(s, usage_budget=caps, waiting=waiting, status=status)


def fingerprints(e: RunEvent) -> dict[str, str]:
    raw = e.attributes.get(STAGES_ATTRIBUTE)
    if not raw:
        return {}
    try:
        doc = json.loads(raw)
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in doc.items()} if isinstance(doc, dict) else {}


def upgraded(s: RunState, e: RunEvent, pos: Position | None) -> tuple[RunState, Outcome]:
    """``RUN_UPGRADED``: an operator moved the run to the workflow in ``e.workflow`` (``runlog upgrade``).

    The run goes on from the checkpoint the event names (attributes ``checkpoint``, ``completed``: the
    stages it keeps, ``outputs``: their outputs; ``artifact_refs``: the checkpoint's artifacts), or from
    the first stage when it names none. The stages after it run again on the new code: their calls are
    marked ``SUPERSEDED`` (kept for their arguments and open effects, never handed back nor compared),
    effects stay as they are (the ledger keeps a done one from happening twice, an in-doubt one still
    blocks). The status is ``RUNNING`` (a blocked, failed or waiting run too): resumers continue it.
    A kept checkpoint is issued again at this event, so it is the run's latest and resume starts there.
    """
    wf = e.workflow
    assert wf is not None
    try:
        kept = tuple(str(x) for x in json.loads(e.attributes.get("completed", "[]")))
        outputs = {str(k): ArtifactRef(str(v["uri"]), str(v["sha256"]), int(v["size"]),
                                       str(v.get("media_type", "application/octet-stream")))
                   for k, v in json.loads(e.attributes.get("outputs", "{}")).items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return s, Outcome(OutcomeKind.ACCEPTED, "upgrade_malformed")
    calls = {k: c if c.stage in kept else evolve_call(c, status=CallStatus.SUPERSEDED)
             for k, c in s.calls.items()}
    cp_stage = e.stage if kept else None
    nxt = wf.next_stage(cp_stage)
    s = evolve_state(s, status=RunStatus.RUNNING, workflow=wf, stage=None, next_stage=nxt, waiting=None,
                     last_error=None, completed_stages=kept, stage_outputs=outputs, calls=calls,
                     verified_artifacts=tuple(e.artifact_refs),
                     stage_fingerprints=fingerprints(e) or s.stage_fingerprints)
    if cp_stage is None:
        return evolve_state(s, checkpoint=None, checkpoints=()), _ACCEPTED
    floor = int(e.attributes.get("checkpoint_seq", "0") or 0)
    part, off = pos if pos is not None else (-1, -1)
    cp = Checkpoint(checkpoint_id=f"{s.run_id}:{e.seq}", run_id=s.run_id, last_seq=e.seq, partition=part,
                    offset=off, stage=cp_stage, created_at=e.occurred_at, inputs=dict(s.input_versions),
                    artifacts=s.verified_artifacts, verified_by=(), next_stage=nxt,
                    workflow_version=wf.version)
    entry = CheckpointEntry(cp.checkpoint_id, cp_stage, e.seq, part, off, s.last_hash)
    kept_entries = tuple(c for c in s.checkpoints if c.last_seq <= floor)
    s = evolve_state(s, checkpoint=cp, checkpoints=(*kept_entries, entry)[-CHECKPOINT_WINDOW:])
    return s, Outcome(OutcomeKind.ACCEPTED, checkpoint=cp)


def resolved(s: RunState, e: RunEvent) -> tuple[RunState, Outcome]:
    """``EFFECT_RESOLVED``: an operator decided an in-doubt effect (``runlog.processors.operate``).

    ``decision=done``: the effect is closed ``DONE`` with the external id, and its call gets the
    result ``payload_ref`` (``{"external_id": ...}``), which resume hands back instead of calling.
    ``decision=not_done``: the effect is closed ``FAILED`` (it did not happen) and the call is marked
    failed, so resume makes the call again, once. The run stays ``BLOCKED`` while another open
    effect would block it again (``NEVER`` or unknown policy), else it is ``RUNNING`` (no writer:
    resumers continue it). A ``CANCELLED`` run stays cancelled."""
    done = e.attributes.get("decision") == "done"
    s, out = effect(s, e, EffectStatus.DONE if done else EffectStatus.FAILED)
    if e.call_id is not None:
        if not done:
            s = update_call(s, e, CallStatus.FAILED, None)
        elif e.payload_ref is not None:
            s = update_call(s, e, CallStatus.RESULT, e.payload_ref)
    if s.status is RunStatus.CANCELLED:
        return s, out  # a cancelled run's in-doubt effect decided: it stays cancelled
    blocking = any(x.replay_policy in (None, ReplayPolicy.NEVER) for x in s.open_effects.values())
    if blocking:
        s = evolve_state(s, status=RunStatus.BLOCKED)
    elif s.status is RunStatus.BLOCKED:
        s = evolve_state(s, status=RunStatus.RUNNING)
    return s, out


def update_call(s: RunState, e: RunEvent, status: CallStatus, result: ArtifactRef | None,
                also: Mapping[str, Any] | None = None) -> RunState:
    """``s`` with the call of ``e`` (its ``call_id`` is set) in ``status``; ``also``: other fields to
    change in the same copy."""
    assert e.call_id is not None
    old = s.calls.get(e.call_id)
    if old is None:
        old = CallRecord(call_id=e.call_id, tool=e.tool, policy=e.replay_policy, status=status,
                         stage=e.stage or s.stage, seq=e.seq, delivery_key=e.delivery_key)
    call = evolve_call(old, status=status, result=result if result is not None else old.result)
    if also:
        return evolve_state(s, **also, calls={**s.calls, e.call_id: call})
    return evolve_state(s, calls={**s.calls, e.call_id: call})


def effect(s: RunState, e: RunEvent, status: EffectStatus) -> tuple[RunState, Outcome]:
    dk = e.delivery_key
    assert dk is not None
    old = s.open_effects.get(dk) or s.closed_effects.get(dk)
    entry = EffectEntry(
        delivery_key=dk,
        run_id=s.run_id,
        target=e.target or (old.target if old else ""),
        status=status,
        seq=e.seq,
        updated_at=e.occurred_at,
        call_id=e.call_id or (old.call_id if old else None),
        tool=e.tool or (old.tool if old else None),
        stage=e.stage or (old.stage if old else s.stage),
        external_id=e.external_id or (old.external_id if old else None),
        replay_policy=e.replay_policy or (old.replay_policy if old else None),
        request_hash=e.request_hash or (old.request_hash if old else None),
        # When this run first opened the effect: fixed from then on, so the entry's sort key in the
        # global ledger only improves (an entry from state JSON without it freezes its updated_at).
        opened_at=(old.updated_at if old.opened_at is None else old.opened_at) if old else e.occurred_at,
    )
    opened = dict(s.open_effects)
    closed = dict(s.closed_effects)
    opened.pop(dk, None)
    closed.pop(dk, None)
    if status is EffectStatus.INTENT:
        opened[dk] = entry
    else:
        closed[dk] = entry
    calls = s.calls
    if entry.call_id is not None and entry.call_id in calls and calls[entry.call_id].delivery_key != dk:
        calls = {**calls, entry.call_id: evolve_call(calls[entry.call_id], delivery_key=dk)}
    s = evolve_state(s, open_effects=opened, closed_effects=closed, calls=calls)
    return s, Outcome(OutcomeKind.ACCEPTED, effects=(entry,))


def spent(s: RunState, e: RunEvent) -> tuple[RunState, Outcome]:
    """A ``TOOL_RESULT`` with usage: the call's tokens and cost added to the run's totals, its stage's
    and its model's (:mod:`runlog.projections._usage`); the outcome carries the usage (the projector's
    metrics count it once, as the fold accepts it once)."""
    u = e.usage
    assert u is not None
    stage = e.stage or s.stage or ""
    stages = {**s.stage_usage, stage: s.stage_usage.get(stage, NO_USAGE).add(u)}
    models = {**s.model_usage, u.model: s.model_usage.get(u.model, NO_USAGE).add(u)}
    s = evolve_state(s, usage=s.usage.add(u), stage_usage=stages, model_usage=models)
    return s, Outcome(OutcomeKind.ACCEPTED, usage=u)
