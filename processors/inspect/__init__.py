"""Reading runs from the log for operators: one run's history and timeline, the calls of a run
(how each result came to be), every run's state when no projector has written Redis, and
payloads shown safely (pretty, truncated, with anything that looks like a credential masked).

This module holds what an operator asks about a run (why it is not moving, its summary line) and
its terminal timeline; the log is read in :mod:`runlog.processors.inspect.log`, the calls are told in
:mod:`runlog.processors.inspect.calls`, payloads are shown by :mod:`runlog.processors.inspect.payloads`. Every
name stays importable from here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from runlog.processors.inspect.calls import HOW, CallView, call_views
from runlog.processors.inspect.log import LoggedEvent, partitions_of, run_history, runs_from_log
from runlog.processors.inspect.payloads import payload_text, payload_value, redact, redact_text, text_opener
from runlog.processors.inspect.upgrades import describe_upgrade
from runlog.projections import OutcomeKind, RunState, RunStatus
from runlog.schemas import EventType

__all__ = [
    "HOW",
    "CallView",
    "LoggedEvent",
    "call_views",
    "partitions_of",
    "payload_text",
    "payload_value",
    "reason_of",
    "redact",
    "redact_text",
    "render_timeline",
    "run_history",
    "run_summary",
    "runs_from_log",
    "text_opener",
    "usage_doc",
    "usage_lines",
]


# -- what an operator asks about a run ----------------------------------------------------------


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


def _as_is(text: str) -> str:
    return text


def reason_of(state: RunState, opener: Callable[[str], str] = _as_is) -> str | None:
    """Why the run is not moving: the ``RUN_BLOCKED`` (or ``FAILED``) message, or the awaited
    signal of a waiting run; None for a run that is running or done. ``opener`` opens a sealed message
    (``ArtifactStore.open_text`` of a store with the keyring); one left sealed shows ``[sealed]``."""
    if state.status is RunStatus.WAITING:
        w = state.waiting
        if w is None:
            return "waiting for a signal"
        if w.signal == "runlog.sleep" and w.deadline_ms:  # ctx.sleep: a durable timer
            left = max(0, round(w.deadline_ms / 1000 - time.time()))
            return f"sleeping until {_iso(w.deadline_ms)} (in {left} s; {w.call_id})"
        if w.signal == "runlog.limit" and w.deadline_ms:  # a call's durable wait for its rate limit
            left = max(0, round(w.deadline_ms / 1000 - time.time()))
            return f"waiting for its rate limit until {_iso(w.deadline_ms)} (in {left} s; {w.call_id})"
        until = f" until {_iso(w.deadline_ms)}" if w.deadline_ms else ""
        return f"waiting for signal {w.signal!r}{until}"
    if state.status in (RunStatus.BLOCKED, RunStatus.FAILED, RunStatus.CANCELLED):
        return None if state.last_error is None else redact_text(opener(state.last_error.message))
    return None


def usage_doc(state: RunState) -> dict[str, Any]:
    """What the run's model calls spent: ``total`` (its own, for a branch what its parent had
    spent at the fork, and what its ended children spent), ``own``, ``inherited`` (None for a run that
    is no branch), ``children`` (what the children whose outcomes it recorded spent; None: none), and
    its own by stage and by model (:class:`runlog.projections._usage.UsageTotals` as dicts)."""
    inherited = state.inherited_usage
    children = state.children_total
    return {"total": state.total_usage.to_dict(), "own": state.usage.to_dict(),
            "inherited": None if inherited is None else inherited.to_dict(),
            "children": None if children is None else children.to_dict(),
            "stages": {k: v.to_dict() for k, v in sorted(state.stage_usage.items())},
            "models": {k: v.to_dict() for k, v in sorted(state.model_usage.items())}}


def usage_lines(state: RunState) -> list[str]:
    """``runlog show``'s usage lines: the total, a branch's inherited and own spend apart, per stage
    and per model; none for a run without model usage."""
    if not state.total_usage.calls:
        return []
    lines = [f"usage: {state.total_usage.describe()}"]
    if state.inherited_usage is not None:
        lines.append(f"    inherited from {state.parent_run_id} at seq {state.forked_from_seq}: "
                     f"{state.inherited_usage.describe()}")
        lines.append(f"    this branch: {state.usage.describe()}")
    children = state.children_total
    if children is not None:
        lines.append(f"    own: {state.usage.describe()}")
        lines.append(f"    children ({len(state.children_usage)} ended, recorded with their outcomes): "
                     f"{children.describe()}")
    lines += [f"    stage {k}: {v.describe()}" for k, v in sorted(state.stage_usage.items())]
    lines += [f"    model {k}: {v.describe()}" for k, v in sorted(state.model_usage.items())]
    return lines


def run_summary(state: RunState, opener: Callable[[str], str] = _as_is) -> dict[str, Any]:
    """A run as ``runlog runs`` lists it: workflow, status, where it is, why it stopped, what it
    waits for, and its open effects with full delivery keys (``opener``: see :func:`reason_of`)."""
    w = state.waiting
    return {
        "run_id": state.run_id,
        "workflow": state.workflow_name,
        "workflow_version": state.workflow_version,
        "status": state.status.value,
        "stage": state.stage,
        "next_stage": state.next_stage,
        "last_seq": state.last_seq,
        "epoch": state.epoch,
        "updated_at": state.updated_at,
        "reason": reason_of(state, opener),
        "waiting": None if w is None else {"signal": w.signal, "call_id": w.call_id,
                                           "deadline_ms": w.deadline_ms},
        "open_effects": [{"tool": e.tool, "call_id": e.call_id, "delivery_key": e.delivery_key,
                          "target": e.target, "stage": e.stage,
                          "policy": None if e.replay_policy is None else e.replay_policy.value,
                          "status": e.status.value}
                         for e in state.open_intents],
        "usage": usage_doc(state),
    }


# -- the terminal timeline ----------------------------------------------------------------------

_MARK = {
    EventType.RUN_STARTED: "●", EventType.LEASE_ACQUIRED: "⚷", EventType.STAGE_STARTED: "▶",
    EventType.TOOL_CALLED: "→", EventType.TOOL_RESULT: "←", EventType.EFFECT_INTENT: "!",
    EventType.EFFECT_RESULT: "✓", EventType.EFFECT_RECONCILED: "≈", EventType.VERIFIED: "■",
    EventType.FAILED: "✗", EventType.RUN_BLOCKED: "⛔", EventType.RUN_COMPLETED: "◆",
    EventType.RUN_BRANCHED: "⑂", EventType.CALL_DIVERGED: "≠", EventType.RUN_WAITING: "⏸",
    EventType.SIGNAL_RECEIVED: "✉", EventType.RUN_CANCELLED: "⊘", EventType.EFFECT_RESOLVED: "⚖",
    EventType.RUN_UPGRADED: "⇪",
}

_DK_TYPES = (EventType.EFFECT_INTENT, EventType.EFFECT_RECONCILED, EventType.EFFECT_RESOLVED)


def render_timeline(history: list[LoggedEvent], opener: Callable[[str], str] = _as_is) -> str:
    """A run's events as lines: seq, epoch, mark, type, stage and what matters about each
    (delivery keys in full: operators copy them into ``runlog resolve``; ``opener``: see
    :func:`reason_of`)."""
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
        if e.delivery_key and e.type in _DK_TYPES:
            bits.append(f"dk={e.delivery_key}")
        for k in ("source", "signal", "by", "reason"):
            if e.attributes.get(k):
                bits.append(f"{k}={redact_text(opener(e.attributes[k]))}")
        if e.type is EventType.RUN_UPGRADED:
            bits += [describe_upgrade(e.attributes), f"by={redact_text(e.attributes.get('operator', '?'))}"]
        if e.type is EventType.VERIFIED:
            bits.append(f"{len(e.artifact_refs)} artifacts, rules: "
                        + ", ".join(r.rule for r in e.verification))
        if e.error is not None:
            bits.append(redact_text(f"{e.error.kind}: {opener(e.error.message)}"))
        if le.outcome.kind is not OutcomeKind.ACCEPTED:
            bits.append(f"[{le.outcome.kind.value}: {le.outcome.reason}]")
        stage = e.stage or ""
        lines.append(f"{e.seq:>5} e{e.epoch:<2} {_MARK.get(e.type, '?')} {e.type.value:<17} "
                     f"{stage:<9} {' '.join(bits)}".rstrip())
    return "\n".join(lines)
