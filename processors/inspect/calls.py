"""The calls of a run, and how each result came to be (:data:`HOW`): executed, reused by a resume,
reconciled, resolved by an operator, open, failed, diverged, waiting or signalled, read from the
run's accepted events (:func:`call_views`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from runlog.processors.inspect.log import LoggedEvent
from runlog.processors.inspect.payloads import redact_text
from runlog.producers.internal import label
from runlog.schemas import ArtifactRef, EventType, RunEvent

__all__ = ["HOW", "CallView", "call_views"]


HOW = ("executed", "reused", "reconciled", "resolved", "open", "called", "failed", "diverged", "waiting",
       "signalled")
"""How a call's result came to be (``CallView.how``):

* ``executed``   the tool ran in this run and its result is recorded;
* ``reused``     a resume handed back the result recorded at an earlier epoch: nothing was called
  and nothing appended for it (the run went on past it after the lease was taken);
* ``reconciled`` the result came from the external system or the effects ledger
  (``EFFECT_RECONCILED``, or ``TOOL_RESULT`` with ``source`` ``reconciled`` / ``ledger``);
* ``resolved``   an operator decided the effect's outcome (``EFFECT_RESOLVED``); it stays
  ``resolved`` when a later resume hands its result back (``reused_at`` says when);
* ``open``       an effect intent without a result: in doubt;
* ``called``     called, no result recorded (crashed or in flight);
* ``failed``     the tool failed (``FAILED``); ``diverged``: the resumed code called something else at
  this position (``CALL_DIVERGED``);
* ``waiting``    ``ctx.wait_for`` waits for a signal (``RUN_WAITING``), or ``ctx.sleep`` sleeps until its
  wake time (shown); ``signalled``: the signal arrived
  (``SIGNAL_RECEIVED``), and like ``resolved`` stays so when a resume hands it back.
"""

SLEEP_TOOL = "runlog.sleep"
"""The tool name of a durable timer's position (``ctx.sleep``): ``runlog show`` gives its wake time."""


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


_REUSABLE = frozenset({"executed", "reused", "reconciled"})
"""Results that become ``reused`` when a resume hands them back; ``resolved`` and ``signalled`` keep
their name (what a person decided matters more) and only record the epoch in ``reused_at``."""
_KEPT = frozenset({"resolved", "signalled"})


@dataclass
class CallView:
    """One tool call of a run as the log tells it (see :data:`HOW`)."""

    call_id: str
    stage: str | None = None
    tool: str | None = None
    policy: str | None = None
    how: str = "called"
    detail: str = ""
    epoch: int = 0
    """Epoch of the event (or, for ``reused``, of the lease) that decided ``how``."""
    first_seq: int = 0
    last_seq: int = 0
    """Seq of the last event of this call."""
    delivery_key: str | None = None
    target: str | None = None
    external_id: str | None = None
    args: ArtifactRef | None = None
    result: ArtifactRef | None = None
    origin: str | None = None
    """For ``reused``: how the result was first recorded (``executed``, ``reconciled``)."""
    recorded_epoch: int | None = None
    """For ``reused``: the epoch that recorded the result."""
    reused_at: list[int] = field(default_factory=list)
    """Epochs whose resume handed this call's recorded result back."""

    @property
    def index(self) -> int:
        tail = self.call_id.rsplit("/", 1)[-1]
        return int(tail) if tail.isdigit() else -1

    def to_dict(self) -> dict[str, Any]:
        return {"call_id": self.call_id, "stage": self.stage, "tool": self.tool, "policy": self.policy,
                "how": self.how, "detail": self.detail, "epoch": self.epoch, "first_seq": self.first_seq,
                "last_seq": self.last_seq, "delivery_key": self.delivery_key, "target": self.target,
                "external_id": self.external_id, "origin": self.origin,
                "recorded_epoch": self.recorded_epoch, "reused_at": list(self.reused_at),
                "args": None if self.args is None else label(self.args),  # never an inline payload itself
                "result": None if self.result is None else label(self.result)}


def _note(ev: RunEvent, c: CallView) -> None:
    """Fold one event of call ``c`` into its view."""
    t, a = ev.type, ev.attributes
    c.last_seq, c.stage, c.tool = ev.seq, c.stage or ev.stage, c.tool or ev.tool
    if ev.replay_policy is not None:
        c.policy = ev.replay_policy.value
    c.delivery_key = ev.delivery_key or c.delivery_key
    c.target = ev.target or c.target
    c.external_id = ev.external_id or c.external_id
    decided = True
    if t is EventType.TOOL_CALLED:
        c.how, c.detail, c.args, c.result = "called", "", ev.payload_ref or c.args, None
        c.origin = c.recorded_epoch = None
    elif t is EventType.EFFECT_INTENT:
        c.how, c.detail = "open", "effect intent without a result"
    elif t is EventType.EFFECT_RESULT:
        c.how, c.detail = "executed", "effect done; its tool result not recorded yet"
    elif t is EventType.EFFECT_RECONCILED:
        c.how, c.result = "reconciled", ev.payload_ref or c.result
        c.detail = (f"done in run {a['from_run']} (effects ledger)" if a.get("from_run")
                    else "from the effects ledger" if a.get("source") == "ledger"
                    else f"found in {ev.target or c.target or 'the external system'}")
    elif t is EventType.EFFECT_RESOLVED:
        c.how, c.result = "resolved", ev.payload_ref or c.result
        c.detail = redact_text(" ".join(x for x in (
            a.get("decision", "").replace("_", " "), f"by {a['by']}" if a.get("by") else "",
            f"({a['reason']})" if a.get("reason") else "") if x))
    elif t is EventType.TOOL_RESULT:
        c.result = ev.payload_ref or c.result
        src = a.get("source")
        if src is None:
            if c.how not in ("reconciled", "resolved"):
                c.how, c.detail = "executed", ""
        elif src in ("reconciled", "ledger"):
            if c.how != "reconciled":
                c.how, c.detail = "reconciled", "from the effects ledger" if src == "ledger" else "reconciled"
        elif c.how != "resolved":
            c.how, c.detail = "reconciled", f"source={src}"
    elif t is EventType.FAILED:
        c.how, c.detail = "failed", "" if ev.error is None else redact_text(
            f"{ev.error.kind}: {ev.error.message}")
    elif t is EventType.CALL_DIVERGED:
        c.how, c.detail = "diverged", "" if ev.error is None else redact_text(ev.error.message)
    elif t is EventType.RUN_WAITING:
        c.how = "waiting"
        if ev.tool == SLEEP_TOOL and a.get("deadline_ms", "").isdigit():
            c.detail = f"sleeping until {_iso(int(a['deadline_ms']))}"
        elif a.get("signal") == "runlog.limit" and a.get("deadline_ms", "").isdigit():
            c.detail = f"for rate limit {a.get('limit', '?')!r} until {_iso(int(a['deadline_ms']))}"
        else:
            c.detail = f"for signal {a['signal']!r}" if a.get("signal") else "for a signal"
    elif t is EventType.SIGNAL_RECEIVED and ev.tool == SLEEP_TOOL and a.get("timed_out") == "true":
        c.how, c.result, c.detail = "executed", ev.payload_ref or c.result, "woke up"
    elif t is EventType.SIGNAL_RECEIVED:
        c.how, c.result = "signalled", ev.payload_ref or c.result
        c.detail = f"signal {a['signal']!r}" if a.get("signal") else "signal received"
    else:
        decided = False
    if decided:
        c.epoch = ev.epoch


def call_views(history: Iterable[LoggedEvent]) -> list[CallView]:
    """The run's tool calls from its accepted events, in the order they were first called, each
    with how its result came to be (:data:`HOW`). ``reused`` is what the log says by omission: a
    call with a result recorded before a ``LEASE_ACQUIRED`` whose stage the resume re-entered, that
    appended nothing for it and went on past it (a later call of the stage, its ``VERIFIED``, a
    later stage or the run's end)."""
    events = [le.event for le in history if le.outcome.accepted]
    order: list[str] = []
    for le in history:
        if le.outcome.accepted and le.state.workflow is not None:
            order = list(le.state.workflow.stage_names)
            break
    views: dict[str, CallView] = {}
    by_key: dict[str, str] = {}
    lease: RunEvent | None = None
    segment: list[RunEvent] = []

    def close_segment() -> None:
        if lease is None:
            return
        entered = {e.stage for e in segment if e.type is EventType.STAGE_STARTED and e.stage}
        for c in views.values():
            if c.how not in _REUSABLE | _KEPT or c.last_seq >= lease.seq or c.stage not in entered:
                continue
            if not _went_past(c, segment, order):
                continue
            c.reused_at.append(lease.epoch)
            if c.how in _KEPT:
                continue
            if c.how != "reused":
                c.origin, c.recorded_epoch = c.how, c.epoch
            c.how, c.epoch = "reused", lease.epoch
            epochs = ", ".join(str(x) for x in c.reused_at)
            c.detail = (f"{c.origin} at epoch {c.recorded_epoch}; the recorded result was handed back at "
                        f"epoch {epochs}")

    for ev in events:
        if ev.type is EventType.LEASE_ACQUIRED:
            close_segment()
            lease, segment = ev, []
            continue
        segment.append(ev)
        cid = ev.call_id or (by_key.get(ev.delivery_key) if ev.delivery_key else None)
        if cid is None:
            continue
        c = views.get(cid)
        if c is None:
            c = views[cid] = CallView(cid, first_seq=ev.seq)
        _note(ev, c)
        if c.delivery_key:
            by_key[c.delivery_key] = cid
    close_segment()
    return list(views.values())


def _went_past(c: CallView, segment: list[RunEvent], order: list[str]) -> bool:
    pos = order.index(c.stage) if c.stage in order else -1
    for e in segment:
        if e.type is EventType.RUN_COMPLETED:
            return True
        if e.stage == c.stage:
            if e.type is EventType.VERIFIED:
                return True
            tail = (e.call_id or "").rsplit("/", 1)[-1]
            if e.call_id and e.call_id != c.call_id and tail.isdigit() and int(tail) > c.index:
                return True
        elif e.stage in order and pos >= 0 and order.index(e.stage) > pos:
            return True
    return False
