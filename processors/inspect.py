"""Reading runs from the log for operators: one run's history and timeline, the calls of a run
(how each result came to be), every run's state when no projector has written Redis, and
payloads shown safely (pretty, truncated, with anything that looks like a credential masked)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from projections import Outcome, OutcomeKind, RunState, RunStatus, fold, run_events
from schemas import ArtifactRef, ConfigError, EventType, RunEvent, Settings, Topics, partition_for

if TYPE_CHECKING:
    from producers import ArtifactStore

__all__ = [
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
]


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
    t = md.topics.get(topic)
    if t is None or t.error is not None or not t.partitions:
        raise ConfigError(f"the events topic {topic} does not exist on {settings.kafka_bootstrap_servers} "
                          "(check RUNLOG_TOPIC_PREFIX, or create the topics with `runlog init`)")
    return len(t.partitions)


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


def runs_from_log(settings: Settings) -> dict[str, RunState]:
    """Every run on the events topic folded from its first event (what a projector would write to
    Redis): for ``runlog runs`` when no projector has run. Reads the whole topic once with the
    audit's reader; undecodable and mis-keyed records are the projector's dead letters, skipped."""
    from processors.audit import read_records
    from schemas import Codec, DecodeError

    codec = Codec.from_settings(settings)
    states: dict[str, RunState] = {}
    for partition, offset, key, value in read_records(settings):
        if value is None:
            continue
        try:
            ev = codec.decode(value, RunEvent)
        except DecodeError:
            continue
        if key is not None and key != ev.run_id.encode("utf-8"):
            continue
        states[ev.run_id], _ = fold(states.get(ev.run_id), ev, (partition, offset))
    return states


# -- what an operator asks about a run ----------------------------------------------------------


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


def reason_of(state: RunState) -> str | None:
    """Why the run is not moving: the ``RUN_BLOCKED`` (or ``FAILED``) message, or the awaited
    signal of a waiting run; None for a run that is running or done."""
    if state.status is RunStatus.WAITING:
        w = state.waiting
        if w is None:
            return "waiting for a signal"
        until = f" until {_iso(w.deadline_ms)}" if w.deadline_ms else ""
        return f"waiting for signal {w.signal!r}{until}"
    if state.status in (RunStatus.BLOCKED, RunStatus.FAILED, RunStatus.CANCELLED):
        return None if state.last_error is None else redact_text(state.last_error.message)
    return None


def run_summary(state: RunState) -> dict[str, Any]:
    """A run as ``runlog runs`` lists it: workflow, status, where it is, why it stopped, what it
    waits for, and its open effects with full delivery keys."""
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
        "reason": reason_of(state),
        "waiting": None if w is None else {"signal": w.signal, "call_id": w.call_id,
                                           "deadline_ms": w.deadline_ms},
        "open_effects": [{"tool": e.tool, "call_id": e.call_id, "delivery_key": e.delivery_key,
                          "target": e.target, "stage": e.stage,
                          "policy": None if e.replay_policy is None else e.replay_policy.value,
                          "status": e.status.value}
                         for e in state.open_intents],
    }


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
* ``waiting``    ``ctx.wait_for`` waits for a signal (``RUN_WAITING``); ``signalled``: it arrived
  (``SIGNAL_RECEIVED``), and like ``resolved`` stays so when a resume hands it back.
"""

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
                "args": None if self.args is None else self.args.uri,
                "result": None if self.result is None else self.result.uri}


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
        c.detail = f"for signal {a['signal']!r}" if a.get("signal") else "for a signal"
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


# -- payloads, shown safely ---------------------------------------------------------------------

_SECRET_KEY = re.compile(
    r"pass(word|wd|phrase)?$|^pwd$|secret|token|api[-_]?key|apikey|auth(orization)?$|credential|"
    r"private[-_]?key|cookie|session[-_]?id|signature|access[-_]?key|client[-_]?secret", re.I)
_SECRET_TEXT = [
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(-----END [A-Z ]*PRIVATE KEY-----|$)", re.S),
     "[redacted private key]"),
    (re.compile(r"\b(Bearer|Basic|Token)\s+[A-Za-z0-9._~+/=-]{8,}", re.I), r"\1 [redacted]"),
    (re.compile(r"([a-z][a-z0-9+.-]*://)([^/\s:@]+):([^/\s@]+)@", re.I), r"\1\2:[redacted]@"),
    (re.compile(r"\b(sk|rk|pk)_(live|test)_[A-Za-z0-9]{8,}"), "[redacted]"),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"), "[redacted]"),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), "[redacted]"),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"), "[redacted]"),
    (re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"), "[redacted]"),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{35}"), "[redacted]"),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), "[redacted]"),
    (re.compile(r"\b(password|passwd|pwd|secret|token|api[-_]?key|access[-_]?key)(\s*[=:]\s*)"
                r"(\"[^\"]*\"|'[^']*'|[^\s,;&\"']+)", re.I), r"\1\2[redacted]"),
]
MAX_STRING = 300
MAX_ITEMS = 50
MAX_LINES = 40
REDACTED = "[redacted]"


def redact_text(text: str) -> str:
    """``text`` with whatever looks like a credential replaced by ``[redacted]``."""
    for pattern, repl in _SECRET_TEXT:
        text = pattern.sub(repl, text)
    return text


def redact(value: Any, *, max_string: int | None = MAX_STRING, max_items: int | None = MAX_ITEMS) -> Any:
    """A JSON value with credential-looking fields and strings masked, long strings and lists cut."""
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for i, (k, v) in enumerate(value.items()):
            if max_items is not None and i >= max_items:
                out["…"] = f"{len(value) - max_items} more keys"
                break
            secret = _SECRET_KEY.search(str(k)) is not None
            if secret and v is not None and not isinstance(v, (bool, int, float, Mapping, list)):
                out[str(k)] = REDACTED
            elif secret and isinstance(v, list) and all(isinstance(x, str) for x in v):
                out[str(k)] = [REDACTED for _ in v]
            else:
                out[str(k)] = redact(v, max_string=max_string, max_items=max_items)
        return out
    if isinstance(value, list):
        items = value if max_items is None else value[:max_items]
        out_l = [redact(v, max_string=max_string, max_items=max_items) for v in items]
        if len(items) < len(value):
            out_l.append(f"… {len(value) - len(items)} more items")
        return out_l
    if isinstance(value, str):
        text = redact_text(value)
        if max_string is not None and len(text) > max_string:
            text = f"{text[:max_string]}… ({len(value)} chars)"
        return text
    return value


def payload_value(store: ArtifactStore, ref: ArtifactRef | None) -> Any:
    """An artifact as a JSON value for ``--json`` output: parsed and redacted when it is JSON,
    redacted text when it is text, a description otherwise (or of why it cannot be read)."""
    from schemas import ArtifactError

    if ref is None:
        return None
    try:
        data = store.get(ref)
    except ArtifactError as err:
        return {"unavailable": str(err), "uri": ref.uri}
    if "json" in ref.media_type:
        try:
            return redact(json.loads(data))
        except ValueError:
            pass
    if ref.media_type.startswith("text/") or "json" in ref.media_type:
        return redact(data.decode("utf-8", "replace"), max_string=MAX_STRING * 10)
    return {"media_type": ref.media_type, "size": ref.size, "sha256": ref.sha256}


def payload_text(store: ArtifactStore, ref: ArtifactRef | None, *, max_lines: int = MAX_LINES) -> str:
    """An artifact for the terminal: pretty JSON (or text), redacted, at most ``max_lines`` lines."""
    if ref is None:
        return "(none recorded)"
    if "json" not in ref.media_type and not ref.media_type.startswith("text/"):
        return f"<{ref.media_type}, {ref.size} bytes, sha256 {ref.sha256}>"
    value = payload_value(store, ref)
    text = value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)
    lines = text.splitlines() or [""]
    if len(lines) > max_lines:
        lines = [*lines[:max_lines], f"… {len(lines) - max_lines} more lines"]
    return "\n".join(lines)


# -- the terminal timeline ----------------------------------------------------------------------

_MARK = {
    EventType.RUN_STARTED: "●", EventType.LEASE_ACQUIRED: "⚷", EventType.STAGE_STARTED: "▶",
    EventType.TOOL_CALLED: "→", EventType.TOOL_RESULT: "←", EventType.EFFECT_INTENT: "!",
    EventType.EFFECT_RESULT: "✓", EventType.EFFECT_RECONCILED: "≈", EventType.VERIFIED: "■",
    EventType.FAILED: "✗", EventType.RUN_BLOCKED: "⛔", EventType.RUN_COMPLETED: "◆",
    EventType.RUN_BRANCHED: "⑂", EventType.CALL_DIVERGED: "≠", EventType.RUN_WAITING: "⏸",
    EventType.SIGNAL_RECEIVED: "✉", EventType.RUN_CANCELLED: "⊘", EventType.EFFECT_RESOLVED: "⚖",
}

_DK_TYPES = (EventType.EFFECT_INTENT, EventType.EFFECT_RECONCILED, EventType.EFFECT_RESOLVED)


def render_timeline(history: list[LoggedEvent]) -> str:
    """A run's events as lines: seq, epoch, mark, type, stage and what matters about each
    (delivery keys in full: operators copy them into ``runlog resolve``)."""
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
                bits.append(f"{k}={redact_text(e.attributes[k])}")
        if e.type is EventType.VERIFIED:
            bits.append(f"{len(e.artifact_refs)} artifacts, rules: "
                        + ", ".join(r.rule for r in e.verification))
        if e.error is not None:
            bits.append(redact_text(f"{e.error.kind}: {e.error.message}"))
        if le.outcome.kind is not OutcomeKind.ACCEPTED:
            bits.append(f"[{le.outcome.kind.value}: {le.outcome.reason}]")
        stage = e.stage or ""
        lines.append(f"{e.seq:>5} e{e.epoch:<2} {_MARK.get(e.type, '?')} {e.type.value:<17} "
                     f"{stage:<9} {' '.join(bits)}".rstrip())
    return "\n".join(lines)
