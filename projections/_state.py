"""The run-state value the fold computes, its parts, and its JSON form (pure: no I/O, no drivers)."""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from enum import Enum, StrEnum
from operator import attrgetter
from typing import Any

from runlog.projections._budget import BudgetCaps
from runlog.projections._usage import NO_USAGE, UsageTotals
from runlog.schemas import (
    ArtifactRef,
    Checkpoint,
    Effect,
    EffectStatus,
    ErrorInfo,
    ReplayPolicy,
    RuleResult,
    StageSpec,
    WorkflowSpec,
)
from runlog.schemas.internal import PlainMapping

__all__ = [
    "CallRecord",
    "CallStatus",
    "CheckpointEntry",
    "EffectEntry",
    "RejectedEvent",
    "RunState",
    "RunStatus",
    "StoredCheckpoint",
    "WaitInfo",
    "call_from_json",
    "call_to_json",
    "state_from_json",
    "state_to_json",
    "state_to_json_but_calls",
]

JSON_VERSION = 1


class RunStatus(StrEnum):
    """Where a run stands, as the log tells it."""

    PENDING = "PENDING"
    """Known from some event, but no accepted ``RUN_STARTED`` yet."""
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    BLOCKED = "BLOCKED"
    WAITING = "WAITING"
    """Stage code waits for a signal; no writer holds the run."""
    CANCELLED = "CANCELLED"


class CallStatus(StrEnum):
    CALLED = "called"
    RESULT = "result"
    FAILED = "failed"
    SUPERSEDED = "superseded"
    """A call of a stage an upgrade runs again on new code (``RUN_UPGRADED``): kept for its arguments
    and open effect, never handed back nor compared by the determinism guard."""


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One tool call: what resume needs to reuse a recorded result or find an open intent."""

    call_id: str
    tool: str | None
    policy: ReplayPolicy | None
    status: CallStatus
    stage: str | None
    seq: int
    """Seq of the ``TOOL_CALLED`` event."""
    args: ArtifactRef | None = None
    result: ArtifactRef | None = None
    idempotency_key: str | None = None
    delivery_key: str | None = None
    request_hash: str | None = None


@dataclass(frozen=True, slots=True)
class EffectEntry(Effect):
    """One entry of the effects ledger (an :class:`~runlog.schemas.Effect`, the record published on the
    effects topic), with the call that caused it."""

    call_id: str | None = None
    replay_policy: ReplayPolicy | None = None
    request_hash: str | None = None
    opened_at: int | None = None
    """``occurred_at`` of the event that first opened this effect in this run (None in state JSON
    written before the field existed: :attr:`sort_key` then uses ``updated_at``)."""

    @property
    def sort_key(self) -> str:
        """Which run's entry the global ledger (``effects:by_key``) shows when several runs share
        a delivery key: the smallest key wins. Done beats open (rank 0 for ``DONE`` and
        ``RECONCILED``, 1 for anything else), then the earliest opened, then the run id. Within one
        run the key only stays equal or gets smaller, so keeping the smallest key seen gives the
        same winner whatever order the runs are processed in. Compare as bytes (UTF-8)."""
        rank = 0 if self.status in (EffectStatus.DONE, EffectStatus.RECONCILED) else 1
        opened = self.updated_at if self.opened_at is None else self.opened_at
        return f"{rank}:{min(max(opened, 0), 999_999_999_999_999):015d}:{self.run_id}"

    def to_effect(self) -> Effect:
        """The ledger record published on the effects topic (this entry without the call)."""
        return _effect_part(self)


@dataclass(frozen=True, slots=True)
class WaitInfo:
    """What a ``WAITING`` run waits for (from its last ``RUN_WAITING``)."""

    call_id: str
    """The wait's position in its stage (``<stage>/runlog.wait/<index>``): the signal's data
    becomes this call's recorded result."""
    signal: str
    deadline_ms: int = 0
    """When the wait times out (epoch ms; 0: never)."""
    children: tuple[str, ...] = ()
    """A wait for child runs (signal ``runlog.child``): the children it waits for; the run is woken
    once every one of them has ended (``RUN_WAITING`` attribute ``runlog.children``)."""
    since_ms: int = 0
    """A call's durable wait for its rate limit (signal ``runlog.limit``): when the call began to
    wait (epoch ms, ``RUN_WAITING`` attribute ``since_ms``); 0 for other waits."""


@dataclass(frozen=True, slots=True)
class CheckpointEntry:
    """Where a checkpoint is in the log: enough to fall back to an earlier one, and an anchor."""

    checkpoint_id: str
    stage: str
    last_seq: int
    partition: int
    offset: int
    last_hash: str | None = None
    """``runlog.schemas.event_hash`` of the ``VERIFIED`` event at ``last_seq``: with ``last_seq``, an anchor
    of the run's hash chain held outside the log (``runlog audit`` compares the log with it). None
    in state JSON written before the field existed."""


@dataclass(frozen=True, slots=True)
class RejectedEvent:
    """An event the fold refused, kept (boundedly) for audits."""

    seq: int
    epoch: int
    type: str
    reason: str
    offset: int = -1


@dataclass(frozen=True, slots=True)
class RunState:
    """Everything the log says about one run, up to ``last_seq``. Immutable: the fold returns new ones.

    Mapping fields are never mutated after construction (the fold copies on write).
    """

    run_id: str
    status: RunStatus = RunStatus.PENDING
    stage: str | None = None
    """The stage in progress (None between stages)."""
    next_stage: str | None = None
    """The stage to run next after the last verified one (from the workflow in ``RUN_STARTED``)."""
    last_seq: int = 0
    epoch: int = 0
    partition: int = -1
    """The Kafka partition of the run's events (-1 when folded without positions)."""
    offset: int = -1
    """Offset of the last record folded, accepted or rejected: the idempotence guard."""
    workflow: WorkflowSpec | None = None
    input_versions: Mapping[str, str] = field(default_factory=dict)
    parent_run_id: str | None = None
    forked_from_seq: int | None = None
    started_at: int = 0
    params_ref: ArtifactRef | None = None
    """The run's parameters (the ``payload_ref`` of ``RUN_STARTED``)."""
    updated_at: int = 0
    """``occurred_at`` of the last accepted event (never wall-clock: rebuilds must be identical)."""
    verified_artifacts: tuple[ArtifactRef, ...] = ()
    stage_outputs: Mapping[str, ArtifactRef] = field(default_factory=dict)
    completed_stages: tuple[str, ...] = ()
    calls: Mapping[str, CallRecord] = field(default_factory=dict)
    open_effects: Mapping[str, EffectEntry] = field(default_factory=dict)
    closed_effects: Mapping[str, EffectEntry] = field(default_factory=dict)
    checkpoint: Checkpoint | None = None
    """The latest checkpoint manifest."""
    checkpoints: tuple[CheckpointEntry, ...] = ()
    """Recent checkpoints, oldest first (bounded), for falling back."""
    last_error: ErrorInfo | None = None
    rejected: Mapping[str, int] = field(default_factory=dict)
    """Rejected-event counts by reason."""
    recent_rejected: tuple[RejectedEvent, ...] = ()
    recent: tuple[tuple[int, str], ...] = ()
    """(seq, content digest) of the last accepted events, oldest first (bounded)."""
    last_hash: str | None = None
    """``runlog.schemas.event_hash`` of the last accepted event: the next event's ``prev_hash``. With
    ``last_seq``, the run's anchor (see :attr:`anchor`)."""
    waiting: WaitInfo | None = None
    """Set while stage code waits for a signal (``RUN_WAITING``) until the signal is received."""
    usage: UsageTotals = NO_USAGE
    """What this run's own model calls spent: the usage recorded with its ``TOOL_RESULT`` events, each
    counted once (:mod:`runlog.projections._usage`); a branch's inherited spend is apart."""
    stage_usage: Mapping[str, UsageTotals] = field(default_factory=dict)
    """Stage name -> what that stage's model calls spent (this run's own calls)."""
    model_usage: Mapping[str, UsageTotals] = field(default_factory=dict)
    """Model name -> what this run's own calls of that model spent."""
    inherited_usage: UsageTotals | None = None
    children_usage: Mapping[str, UsageTotals] = field(default_factory=dict)
    """Child run id -> what that child spent in all (its own children's included), recorded on this
    run's log with the child's outcome (attribute ``runlog.usage.child``): counted in
    :attr:`total_usage` (and so against this run's budget) once, from then on."""
    usage_budget: BudgetCaps | None = None
    """The run's budget (``RUN_STARTED`` attribute ``runlog.budget``, raised by ``runlog budget``:
    :mod:`runlog.projections._budget`); None: no cap."""
    """A branch's parent's totals at the fork (``RUN_BRANCHED``); None for a run that is no branch."""
    stage_fingerprints: Mapping[str, str] = field(default_factory=dict)
    """Stage name -> fingerprint of the definition the run is on (``RUN_STARTED`` or the latest
    ``RUN_UPGRADED``, attribute ``runlog.stages``); empty for runs started before they were recorded."""
    traceparent: str | None = None
    """The W3C trace context the run started in (``RUN_STARTED`` attributes ``traceparent`` and
    ``tracestate``): a resume continues the run's trace from it. None: started untraced."""
    tracestate: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    """Where a submitted run waits and counts: ``queue``, ``tenant``, ``priority`` (``RUN_STARTED``
    attributes ``runlog.queue``, ``runlog.tenant``, ``runlog.priority``); empty for a run started
    otherwise."""
    subject: str | None = None
    """The subject whose data key encrypts the run's payloads (``RUN_STARTED`` attribute
    ``runlog.subject``); None: the default subject, or encryption off."""
    children: tuple[str, ...] = ()
    """The child runs this run started (``ctx.start_child``), in the order of their calls' ``TOOL_CALLED``
    (attribute ``runlog.child_run_id``); kept when their stages are checkpointed."""
    parent_call: str | None = None
    """For a child run: the call of its parent (:attr:`parent_run_id`) that started it (``RUN_STARTED``
    attribute ``runlog.parent_call``); None for a run that is no child (a branch has a parent too)."""

    @property
    def workflow_version(self) -> str:
        return self.workflow.version if self.workflow is not None else ""

    @property
    def workflow_name(self) -> str:
        return self.workflow.name if self.workflow is not None else ""

    @property
    def anchor(self) -> tuple[int, str] | None:
        """``(last_seq, last_hash)``: the run's latest accepted event as the fold saw it. Kept in the
        projection (outside the log), it anchors the hash chain: a log whose event at that seq
        hashes to something else, or that ends before it, is not the log this state was folded
        from. None before any accepted event, and for state JSON written before hashes existed."""
        return None if self.last_hash is None or self.last_seq <= 0 else (self.last_seq, self.last_hash)

    @property
    def total_usage(self) -> UsageTotals:
        """What the run spent in all: its own calls, for a branch its parent's at the fork, and the
        spend of the child runs whose outcomes it has recorded (:attr:`children_usage`)."""
        total = self.usage.plus(self.inherited_usage)
        for spent in self.children_usage.values():
            total = total.plus(spent)
        return total

    @property
    def children_total(self) -> UsageTotals | None:
        """What the children whose outcomes this run recorded spent (None: none recorded)."""
        if not self.children_usage:
            return None
        total = NO_USAGE
        for spent in self.children_usage.values():
            total = total.plus(spent)
        return total

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    @property
    def open_intents(self) -> tuple[EffectEntry, ...]:
        """Effects with an intent and no result, in seq order."""
        return tuple(sorted(self.open_effects.values(), key=lambda e: e.seq))

    def without_audit(self) -> RunState:
        """This state with the rejection bookkeeping cleared: what accepted events alone determine."""
        return replace(self, rejected={}, recent_rejected=(), offset=-1)

    def to_json(self) -> str:
        return state_to_json(self)

    @staticmethod
    def from_json(text: str | bytes) -> RunState:
        return state_from_json(text)


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """A checkpoint manifest with the run state as of its ``VERIFIED`` event."""

    checkpoint: Checkpoint
    state: RunState


# -- copies with changes ----------------------------------------------------------------------------

_UNSET: Any = object()


def _evolver(cls: type[Any]) -> Callable[..., Any]:
    """``dataclasses.replace`` for one frozen slots dataclass (no ``__post_init__``, no init-only
    fields), generated once with the field loop unrolled: a new object whose slots are set
    directly, each from the keyword argument when given, else from the original. The same value as
    ``replace`` gives (which calls ``__init__`` with every field), at about a third of its cost; an
    unknown field name is a ``TypeError`` as with ``replace``."""
    names = [f.name for f in fields(cls)]
    if any(n.startswith("_") or not n.isidentifier() for n in names) or hasattr(cls, "__post_init__"):
        raise TypeError(f"no generated copy for {cls!r}")
    ns: dict[str, Any] = {"_new": object.__new__, "_cls": cls, "_U": _UNSET}
    lines = [f"def _evolve(_o, *, {', '.join(f'{n}=_U' for n in names)}):", "    _n = _new(_cls)"]
    for n in names:
        ns[f"_set_{n}"] = cls.__dict__[n].__set__
        lines.append(f"    _set_{n}(_n, _o.{n} if {n} is _U else {n})")
    lines.append("    return _n")
    exec("\n".join(lines), ns)  # generated from the class's own field names
    fn: Callable[..., Any] = ns["_evolve"]
    return fn


_effect_fields = attrgetter(*(f.name for f in fields(Effect)))


def _effect_part(e: Effect) -> Effect:
    """The :class:`~runlog.schemas.Effect` part of an entry (or of any Effect)."""
    return Effect(*_effect_fields(e))


evolve_state: Callable[..., RunState] = _evolver(RunState)
"""``evolve_state(s, **changes)``: ``dataclasses.replace(s, **changes)`` for a :class:`RunState`, faster."""
evolve_call: Callable[..., CallRecord] = _evolver(CallRecord)
"""``evolve_call(c, **changes)``: ``dataclasses.replace(c, **changes)`` for a :class:`CallRecord`."""


# -- JSON ------------------------------------------------------------------------------------------

STATE_JSON = PlainMapping(
    positional=(ArtifactRef, RuleResult, ErrorInfo, StageSpec, CheckpointEntry, RejectedEvent, WaitInfo,
                UsageTotals, BudgetCaps),
    keyed={(RunState, "calls"): "call_id", (RunState, "open_effects"): "delivery_key",
           (RunState, "closed_effects"): "delivery_key"},
)
"""The run state's JSON style of the one record mapping (:class:`runlog.schemas._plain.PlainMapping`):
small records as lists of their field values, calls and effects as lists sorted by key, fields
added after a state was written read as their defaults (an old state stays readable)."""

checkpoint_to_dict: Callable[[Checkpoint], dict[str, Any]] = STATE_JSON.to_plain(Checkpoint)
checkpoint_from_dict: Callable[[Mapping[str, Any]], Checkpoint] = STATE_JSON.from_plain(Checkpoint)
effect_to_dict: Callable[[EffectEntry], dict[str, Any]] = STATE_JSON.to_plain(EffectEntry)
effect_from_dict: Callable[[Mapping[str, Any]], EffectEntry] = STATE_JSON.from_plain(EffectEntry)
state_to_dict: Callable[[RunState], dict[str, Any]] = STATE_JSON.to_plain(RunState, extra={"v": JSON_VERSION})
state_from_dict: Callable[[Mapping[str, Any]], RunState] = STATE_JSON.from_plain(RunState)
_call = STATE_JSON.to_plain(CallRecord)


_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True, check_circular=False)
_MAKE_C_ENCODER: Any = getattr(json.encoder, "c_make_encoder", None)  # None without the _json module
_C_ENCODE: Any = None if _MAKE_C_ENCODER is None else _MAKE_C_ENCODER(
    None, _ENCODER.default, json.encoder.encode_basestring_ascii, None, ":", ",", True, False, True)


def _ENCODE(v: Any) -> str:
    """``json.dumps(v, separators=(",", ":"), sort_keys=True)``; the values are built fresh from frozen
    records (no cycles), so the circular-reference check (it changes no text) is off. The C encoder
    is made once and called directly (what ``JSONEncoder.encode`` does, less a Python frame and the
    encoder's construction per call: about 1 us of each of the many small values a state writes)."""
    if _C_ENCODE is None:
        return _ENCODER.encode(v)
    return "".join(_C_ENCODE(v, 0))

_encode_str: Callable[[str], str] = json.encoder.encode_basestring_ascii
"""A string's JSON text as :data:`_ENCODE` writes it (ASCII, escaped)."""


class _IdentityTexts:
    """Texts of immutable records, cached by object identity: a call record or a pair of the
    ``recent`` window is shared by every later state of its run until it changes, so a run's
    snapshot encodes only what changed since the last one. An entry holds its record, so the id
    cannot be reused while it is cached. Bounded: when the current generation holds ``size``
    entries it becomes the old one (entries used again are carried over) and the older one is
    dropped."""

    __slots__ = ("current", "make", "old", "size")

    def __init__(self, make: Callable[[Any], str], size: int) -> None:
        self.make = make
        self.size = size
        self.current: dict[int, tuple[Any, str]] = {}
        self.old: dict[int, tuple[Any, str]] = {}

    def text(self, obj: Any) -> str:
        k = id(obj)
        hit = self.current.get(k)
        if hit is None or hit[0] is not obj:
            hit = self.old.get(k)
            if hit is None or hit[0] is not obj:
                hit = (obj, self.make(obj))
            if len(self.current) >= self.size:
                self.old, self.current = self.current, {}
            self.current[k] = hit
        return hit[1]


_CALL_TEXTS = _IdentityTexts(lambda c: _ENCODE(_call(c)), 16_384)
"""``_ENCODE(_call(c))`` of a call record (:class:`_IdentityTexts`)."""
_call_text: Callable[[CallRecord], str] = _CALL_TEXTS.text


_STATE_FIELDS = tuple(f.name for f in fields(RunState))

_PAIR_TEXTS = _IdentityTexts(lambda p: f"[{int(p[0])},{_encode_str(p[1])}]", 65_536)
"""``_ENCODE(list(p))`` of a pair of the ``recent`` window (:class:`_IdentityTexts`): a pair is
shared by the 64 states whose window holds it."""


def _pairs_text(pairs: tuple[tuple[int, str], ...]) -> list[str]:
    """Each pair's text (:data:`_PAIR_TEXTS`), looked up inline: a call per pair was most of the
    window's cost."""
    texts = _PAIR_TEXTS.current
    return [t[1] if (t := texts.get(id(p))) is not None and t[0] is p else _PAIR_TEXTS.text(p)
            for p in pairs]


class _WindowTexts:
    """Texts of ``recent`` windows, found by the identity of their last pair (which the window
    holds, so the id cannot be reused while it is cached); bounded like :class:`_IdentityTexts`."""

    __slots__ = ("current", "old", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.current: dict[int, tuple[tuple[tuple[int, str], ...], str]] = {}
        self.old: dict[int, tuple[tuple[tuple[int, str], ...], str]] = {}

    def get(self, pair: tuple[int, str]) -> tuple[tuple[tuple[int, str], ...], str] | None:
        hit = self.current.get(id(pair))
        if hit is None or hit[0][-1] is not pair:
            hit = self.old.get(id(pair))
            if hit is None or hit[0][-1] is not pair:
                return None
        return hit

    def put(self, window: tuple[tuple[int, str], ...], text: str) -> None:
        if len(self.current) >= self.size:
            self.old, self.current = self.current, {}
        self.current[id(window[-1])] = (window, text)


_WINDOW_TEXTS = _WindowTexts(1_024)
"""The last windows written (about 3 KB of text each): a run's next window is its last one with the
oldest pairs dropped and the new ones added."""
_WINDOW_BACK = 4
"""How many pairs a window may have gained since the window it is made from was written."""


def _recent_text(recent: tuple[tuple[int, str], ...]) -> str:
    """The ``recent`` window's text: most of a snapshot's (64 seq and digest pairs, about 2 KB) and
    what the generic encoder was slowest at (a list per pair). The fold slides the window by an
    event at a time, so a run's window is mostly the one written at its last update: its text is
    that window's with the dropped pairs cut off the front and the new pairs' texts added
    (:data:`_WINDOW_TEXTS`; checked pair by pair, else made from each pair's text)."""
    n = len(recent)
    if n == 0:
        return "[]"
    for added in range(min(n, _WINDOW_BACK + 1)):
        hit = _WINDOW_TEXTS.get(recent[n - 1 - added])
        if hit is None:
            continue
        prev, text = hit
        kept = n - added
        dropped = len(prev) - kept
        if dropped < 0 or prev[dropped:] != recent[:kept]:
            continue
        if added == 0 and dropped == 0:
            return text
        body = text[1:-1]
        if dropped:
            body = body[sum(map(len, _pairs_text(prev[:dropped]))) + dropped:]
        out = "[" + ",".join([body, *_pairs_text(recent[kept:])]) + "]"  # kept >= 1: body holds a pair
        break
    else:
        out = "[" + ",".join(_pairs_text(recent)) + "]"
    _WINDOW_TEXTS.put(recent, out)
    return out


class _RunFieldTexts:
    """The text of one field's value for each run, kept while that run's field holds the same value
    (by identity): only the latest value of a run is kept, so a field whose value grows over a run
    (the closed effects, the children) is not kept in every version; a text longer than
    :data:`_FIELD_TEXT_MAX` is made every time. Bounded like :class:`_IdentityTexts` (runs)."""

    __slots__ = ("current", "make", "old", "size")

    def __init__(self, make: Callable[[Any], str], size: int) -> None:
        self.make = make
        self.size = size
        self.current: dict[str, tuple[Any, str]] = {}
        self.old: dict[str, tuple[Any, str]] = {}

    def text(self, run_id: str, value: Any) -> str:
        hit = self.current.get(run_id)
        if hit is None or hit[0] is not value:
            hit = self.old.get(run_id)
            if hit is None or hit[0] is not value:
                made = self.make(value)
                if len(made) > _FIELD_TEXT_MAX:
                    return made
                hit = (value, made)
            if len(self.current) >= self.size:
                self.old, self.current = self.current, {}
            self.current[run_id] = hit
        return hit[1]


_FIELD_TEXTS_RUNS = 4_096
"""Runs whose field texts are kept (:class:`_RunFieldTexts`): the runs of a batch fit many times over."""
_FIELD_TEXT_MAX = 4_096
"""The longest field text kept: a longer one (a run with many effects or children) is encoded at each
update, as before, instead of held in memory beside its value."""


def _scalar_text(hint: Any, x: str) -> str | None:
    """An expression writing ``x`` of type ``hint`` as :data:`_ENCODE` does, for the scalar types a
    state's fields hold (``int``, ``str``, either or None, a string enum); None for any other type."""
    args = set(typing.get_args(hint))
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args and len(args) == 2:
        inner = _scalar_text(next(a for a in args if a is not type(None)), x)
        return None if inner is None else f"('null' if {x} is None else {inner})"
    if hint is int:  # a bool or a float where an int belongs is written as the encoder writes it
        return f"(_int({x}) if _type({x}) is int else _enc({x}))"
    if hint is str:
        return f"_str({x})"
    if isinstance(hint, type) and issubclass(hint, Enum) and all(isinstance(m.value, str) for m in hint):
        return f"_str({x}.value)"
    return None


def _field_text(to_plain: Callable[[Any], Any]) -> Callable[[Any], str]:
    """A field value's text: its plain value (``to_plain``) encoded."""
    return lambda v: _ENCODE(to_plain(v))


def _rest_writer() -> Callable[[RunState], str]:
    """The writer of :func:`_rest_text`, generated from :class:`RunState`'s fields.

    The text is put together key by key in sorted order, as the encoder writes the plain dict: a
    scalar written in place; ``recent`` by :func:`_recent_text`; any other value (a record, a tuple, a
    mapping) from the text kept for the run while its field holds that value (:class:`_RunFieldTexts`,
    one per field). The
    state is immutable and so are the values its fields hold (the fold copies on write), and a
    field's value is shared by every later state of the run until it changes: a snapshot encodes
    only what changed since the last one (the checkpoint, the workflow, the usage totals... of a
    run are encoded once, not at every event)."""
    hints = typing.get_type_hints(RunState)
    ns: dict[str, Any] = {"_int": int.__repr__, "_str": _encode_str, "_recent": _recent_text, "_type": type,
                          "_enc": _ENCODE}
    parts: list[str] = []
    for i, name in enumerate(sorted([n for n in _STATE_FIELDS if n != "calls"] + ["v"])):
        key = ("{" if i == 0 else ",") + _encode_str(name) + ":"
        if name == "v":
            parts.append(repr(key + _ENCODE(JSON_VERSION)))
            continue
        parts.append(repr(key))
        expr = "_recent(o.recent)" if name == "recent" else _scalar_text(hints[name], f"o.{name}")
        if expr is None:
            ns[f"_text{i}"] = _RunFieldTexts(_field_text(STATE_JSON.field_to_plain(RunState, name)),
                                             _FIELD_TEXTS_RUNS).text
            expr = f"_text{i}(o.run_id, o.{name})"
        parts.append(expr)
    source = "def _rest(o):\n    return ''.join((" + ", ".join(parts) + ", '}'))\n"
    exec(compile(source, "<state text>", "exec"), ns)  # generated from the class's own field names
    fn: Callable[[RunState], str] = ns["_rest"]
    return fn


_rest_text: Callable[[RunState], str] = _rest_writer()
"""The encoding of :func:`state_to_dict` of a state without its calls (the text ``json.dumps`` with
sorted keys gives it), put together from its fields' texts (:func:`_rest_writer`)."""


def state_to_json(s: RunState) -> str:
    """A canonical JSON text: equal states give equal texts (keys and maps sorted).

    The text of ``json.dumps(state_to_dict(s), separators=(",", ":"), sort_keys=True)``, built as
    ``{"calls":[...],`` (``calls`` sorts first among the keys) followed by the encoding of the
    other keys, with each call's text from :func:`_call_text`."""
    rest = _rest_text(s)
    calls = ",".join([_call_text(c) for _, c in sorted(s.calls.items())])
    return '{"calls":[' + calls + "]," + rest[1:]


def state_from_json(text: str | bytes) -> RunState:
    return state_from_dict(json.loads(text))


def state_to_json_but_calls(s: RunState) -> str:
    """:func:`state_to_json` of ``s`` with no calls: the snapshot a store keeps beside its calls
    when it keeps each call apart (:func:`call_to_json`)."""
    return '{"calls":[],' + _rest_text(s)[1:]


def call_to_json(c: CallRecord) -> str:
    """One call's canonical JSON text, as it appears in :func:`state_to_json` (cached by identity)."""
    return _call_text(c)


_call_from: Callable[[Mapping[str, Any]], CallRecord] = STATE_JSON.from_plain(CallRecord)


def call_from_json(text: str | bytes) -> CallRecord:
    return _call_from(json.loads(text))
