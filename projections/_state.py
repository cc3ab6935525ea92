"""The run-state value the fold computes, its parts, and its JSON form (pure: no I/O, no drivers)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from typing import Any

from schemas._types import (
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
    "state_from_json",
    "state_to_json",
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
class EffectEntry:
    """One entry of the effects ledger, with the call that caused it."""

    delivery_key: str
    run_id: str
    target: str
    status: EffectStatus
    seq: int
    """Seq of the event that last moved this effect."""
    updated_at: int
    call_id: str | None = None
    tool: str | None = None
    stage: str | None = None
    external_id: str | None = None
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
        """The ledger record published on the effects topic."""
        return Effect(
            delivery_key=self.delivery_key,
            run_id=self.run_id,
            target=self.target,
            status=self.status,
            seq=self.seq,
            updated_at=self.updated_at,
            external_id=self.external_id,
            tool=self.tool,
            stage=self.stage,
        )


@dataclass(frozen=True, slots=True)
class WaitInfo:
    """What a ``WAITING`` run waits for (from its last ``RUN_WAITING``)."""

    call_id: str
    """The wait's position in its stage (``<stage>/runlog.wait/<index>``): the signal's data
    becomes this call's recorded result."""
    signal: str
    deadline_ms: int = 0
    """When the wait times out (epoch ms; 0: never)."""


@dataclass(frozen=True, slots=True)
class CheckpointEntry:
    """Where a checkpoint is in the log: enough to fall back to an earlier one, and an anchor."""

    checkpoint_id: str
    stage: str
    last_seq: int
    partition: int
    offset: int
    last_hash: str | None = None
    """``schemas.event_hash`` of the ``VERIFIED`` event at ``last_seq``: with ``last_seq``, an anchor
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
    """``schemas.event_hash`` of the last accepted event: the next event's ``prev_hash``. With
    ``last_seq``, the run's anchor (see :attr:`anchor`)."""
    waiting: WaitInfo | None = None
    """Set while stage code waits for a signal (``RUN_WAITING``) until the signal is received."""

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


evolve_state: Callable[..., RunState] = _evolver(RunState)
"""``evolve_state(s, **changes)``: ``dataclasses.replace(s, **changes)`` for a :class:`RunState`, faster."""
evolve_call: Callable[..., CallRecord] = _evolver(CallRecord)
"""``evolve_call(c, **changes)``: ``dataclasses.replace(c, **changes)`` for a :class:`CallRecord`."""


# -- JSON ------------------------------------------------------------------------------------------


def _art(a: ArtifactRef | None) -> Any:
    return None if a is None else [a.uri, a.sha256, a.size, a.media_type]


def _art_from(v: Any) -> ArtifactRef | None:
    return None if v is None else ArtifactRef(v[0], v[1], int(v[2]), v[3])


def _arts(v: Any) -> tuple[ArtifactRef, ...]:
    return tuple(ArtifactRef(a[0], a[1], int(a[2]), a[3]) for a in v)


def _rule(r: RuleResult) -> Any:
    return [r.rule, r.passed, r.detail]


def _err(e: ErrorInfo | None) -> Any:
    return None if e is None else [e.kind, e.message, e.retryable]


def _workflow(w: WorkflowSpec | None) -> Any:
    if w is None:
        return None
    return {
        "name": w.name,
        "version": w.version,
        "stages": [[s.name, list(s.inputs), list(s.rules), s.checkpoint] for s in w.stages],
    }


def _workflow_from(d: Any) -> WorkflowSpec | None:
    if d is None:
        return None
    stages = tuple(StageSpec(s[0], tuple(s[1]), tuple(s[2]), bool(s[3])) for s in d["stages"])
    return WorkflowSpec(d["name"], d["version"], stages)


def checkpoint_to_dict(c: Checkpoint) -> dict[str, Any]:
    return {
        "checkpoint_id": c.checkpoint_id,
        "run_id": c.run_id,
        "last_seq": c.last_seq,
        "partition": c.partition,
        "offset": c.offset,
        "stage": c.stage,
        "created_at": c.created_at,
        "inputs": dict(sorted(c.inputs.items())),
        "artifacts": [_art(a) for a in c.artifacts],
        "verified_by": [_rule(r) for r in c.verified_by],
        "next_stage": c.next_stage,
        "workflow_version": c.workflow_version,
    }


def checkpoint_from_dict(d: Mapping[str, Any]) -> Checkpoint:
    return Checkpoint(
        checkpoint_id=d["checkpoint_id"],
        run_id=d["run_id"],
        last_seq=int(d["last_seq"]),
        partition=int(d["partition"]),
        offset=int(d["offset"]),
        stage=d["stage"],
        created_at=int(d["created_at"]),
        inputs=dict(d["inputs"]),
        artifacts=_arts(d["artifacts"]),
        verified_by=tuple(RuleResult(r[0], bool(r[1]), r[2]) for r in d["verified_by"]),
        next_stage=d["next_stage"],
        workflow_version=d["workflow_version"],
    )


def effect_to_dict(e: EffectEntry) -> dict[str, Any]:
    return {
        "delivery_key": e.delivery_key,
        "run_id": e.run_id,
        "target": e.target,
        "status": e.status.value,
        "seq": e.seq,
        "updated_at": e.updated_at,
        "call_id": e.call_id,
        "tool": e.tool,
        "stage": e.stage,
        "external_id": e.external_id,
        "replay_policy": None if e.replay_policy is None else e.replay_policy.value,
        "request_hash": e.request_hash,
        "opened_at": e.opened_at,
    }


def effect_from_dict(d: Mapping[str, Any]) -> EffectEntry:
    pol = d.get("replay_policy")
    return EffectEntry(
        delivery_key=d["delivery_key"],
        run_id=d["run_id"],
        target=d["target"],
        status=EffectStatus(d["status"]),
        seq=int(d["seq"]),
        updated_at=int(d["updated_at"]),
        call_id=d.get("call_id"),
        tool=d.get("tool"),
        stage=d.get("stage"),
        external_id=d.get("external_id"),
        replay_policy=None if pol is None else ReplayPolicy(pol),
        request_hash=d.get("request_hash"),
        opened_at=None if d.get("opened_at") is None else int(d["opened_at"]),
    )


def _call(c: CallRecord) -> dict[str, Any]:
    return {
        "call_id": c.call_id,
        "tool": c.tool,
        "policy": None if c.policy is None else c.policy.value,
        "status": c.status.value,
        "stage": c.stage,
        "seq": c.seq,
        "args": _art(c.args),
        "result": _art(c.result),
        "idempotency_key": c.idempotency_key,
        "delivery_key": c.delivery_key,
        "request_hash": c.request_hash,
    }


def _call_from(d: Mapping[str, Any]) -> CallRecord:
    pol = d["policy"]
    return CallRecord(
        call_id=d["call_id"],
        tool=d["tool"],
        policy=None if pol is None else ReplayPolicy(pol),
        status=CallStatus(d["status"]),
        stage=d["stage"],
        seq=int(d["seq"]),
        args=_art_from(d["args"]),
        result=_art_from(d["result"]),
        idempotency_key=d["idempotency_key"],
        delivery_key=d["delivery_key"],
        request_hash=d["request_hash"],
    )


def state_to_dict(s: RunState) -> dict[str, Any]:
    d = _state_dict_but_calls(s)
    d["calls"] = [_call(c) for _, c in sorted(s.calls.items())]
    return d


def _state_dict_but_calls(s: RunState) -> dict[str, Any]:
    return {
        "v": JSON_VERSION,
        "run_id": s.run_id,
        "status": s.status.value,
        "stage": s.stage,
        "next_stage": s.next_stage,
        "last_seq": s.last_seq,
        "epoch": s.epoch,
        "partition": s.partition,
        "offset": s.offset,
        "workflow": _workflow(s.workflow),
        "input_versions": dict(sorted(s.input_versions.items())),
        "parent_run_id": s.parent_run_id,
        "forked_from_seq": s.forked_from_seq,
        "started_at": s.started_at,
        "params_ref": _art(s.params_ref),
        "updated_at": s.updated_at,
        "verified_artifacts": [_art(a) for a in s.verified_artifacts],
        "stage_outputs": {k: _art(v) for k, v in sorted(s.stage_outputs.items())},
        "completed_stages": list(s.completed_stages),
        "open_effects": [effect_to_dict(e) for _, e in sorted(s.open_effects.items())],
        "closed_effects": [effect_to_dict(e) for _, e in sorted(s.closed_effects.items())],
        "checkpoint": None if s.checkpoint is None else checkpoint_to_dict(s.checkpoint),
        "checkpoints": [
            [c.checkpoint_id, c.stage, c.last_seq, c.partition, c.offset, c.last_hash] for c in s.checkpoints
        ],
        "last_error": _err(s.last_error),
        "rejected": dict(sorted(s.rejected.items())),
        "recent_rejected": [[r.seq, r.epoch, r.type, r.reason, r.offset] for r in s.recent_rejected],
        "recent": [[q, d] for q, d in s.recent],
        "last_hash": s.last_hash,
        "waiting": None if s.waiting is None else [s.waiting.call_id, s.waiting.signal,
                                                   s.waiting.deadline_ms],
    }


def state_from_dict(d: Mapping[str, Any]) -> RunState:
    err = d["last_error"]
    cp = d["checkpoint"]
    return RunState(
        run_id=d["run_id"],
        status=RunStatus(d["status"]),
        stage=d["stage"],
        next_stage=d["next_stage"],
        last_seq=int(d["last_seq"]),
        epoch=int(d["epoch"]),
        partition=int(d["partition"]),
        offset=int(d["offset"]),
        workflow=_workflow_from(d["workflow"]),
        input_versions=dict(d["input_versions"]),
        parent_run_id=d["parent_run_id"],
        forked_from_seq=d["forked_from_seq"],
        started_at=int(d["started_at"]),
        params_ref=_art_from(d.get("params_ref")),
        updated_at=int(d["updated_at"]),
        verified_artifacts=_arts(d["verified_artifacts"]),
        stage_outputs={k: ArtifactRef(v[0], v[1], int(v[2]), v[3]) for k, v in d["stage_outputs"].items()},
        completed_stages=tuple(d["completed_stages"]),
        calls={c["call_id"]: _call_from(c) for c in d["calls"]},
        open_effects={e["delivery_key"]: effect_from_dict(e) for e in d["open_effects"]},
        closed_effects={e["delivery_key"]: effect_from_dict(e) for e in d["closed_effects"]},
        checkpoint=None if cp is None else checkpoint_from_dict(cp),
        checkpoints=tuple(  # a sixth item (the hash) since the anchored chain; None before
            CheckpointEntry(c[0], c[1], int(c[2]), int(c[3]), int(c[4]), c[5] if len(c) > 5 else None)
            for c in d["checkpoints"]
        ),
        last_error=None if err is None else ErrorInfo(err[0], err[1], bool(err[2])),
        rejected={k: int(v) for k, v in d["rejected"].items()},
        recent_rejected=tuple(
            RejectedEvent(int(r[0]), int(r[1]), r[2], r[3], int(r[4])) for r in d["recent_rejected"]
        ),
        recent=tuple((int(q), str(h)) for q, h in d["recent"]),
        last_hash=d.get("last_hash"),
        waiting=None if not d.get("waiting") else WaitInfo(str(d["waiting"][0]), str(d["waiting"][1]),
                                                           int(d["waiting"][2])),
    )


_ENCODE = json.JSONEncoder(separators=(",", ":"), sort_keys=True, check_circular=False).encode
"""``json.dumps(v, separators=(",", ":"), sort_keys=True)``, built once; the values are built fresh
from frozen records (no cycles), so the circular-reference check (it changes no text) is off."""

_CALL_TEXTS: dict[int, tuple[CallRecord, str]] = {}
_CALL_TEXTS_OLD: dict[int, tuple[CallRecord, str]] = {}
CALL_TEXT_CACHE = 16_384
"""Entries per generation of the call-text cache (two generations are kept)."""


def _call_text(c: CallRecord) -> str:
    """``_ENCODE(_call(c))``, cached by object identity: a call record is immutable and one record
    is shared by every later state of its run until the call changes, so a run's snapshot encodes
    only the calls that changed since the last one. An entry holds its record, so the id cannot be
    reused while it is cached. Bounded: when a generation is full it becomes the old one (entries
    used again are carried over) and the older one is dropped."""
    global _CALL_TEXTS, _CALL_TEXTS_OLD
    k = id(c)
    hit = _CALL_TEXTS.get(k)
    if hit is None or hit[0] is not c:
        hit = _CALL_TEXTS_OLD.get(k)
        if hit is None or hit[0] is not c:
            hit = (c, _ENCODE(_call(c)))
        if len(_CALL_TEXTS) >= CALL_TEXT_CACHE:
            _CALL_TEXTS_OLD, _CALL_TEXTS = _CALL_TEXTS, {}
        _CALL_TEXTS[k] = hit
    return hit[1]


def state_to_json(s: RunState) -> str:
    """A canonical JSON text: equal states give equal texts (keys and maps sorted).

    The text of ``json.dumps(state_to_dict(s), separators=(",", ":"), sort_keys=True)``, built as
    ``{"calls":[...],`` (``calls`` sorts first among the keys) followed by the encoding of the
    other keys, with each call's text from :func:`_call_text`."""
    rest = _ENCODE(_state_dict_but_calls(s))
    calls = ",".join([_call_text(c) for _, c in sorted(s.calls.items())])
    return '{"calls":[' + calls + "]," + rest[1:]


def state_from_json(text: str | bytes) -> RunState:
    return state_from_dict(json.loads(text))
