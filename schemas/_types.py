"""Python types that map 1:1 onto the Avro records in ``schemas/avro``."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

__all__ = [
    "ArtifactRef",
    "Checkpoint",
    "Effect",
    "EffectStatus",
    "ErrorInfo",
    "EventType",
    "ReplayPolicy",
    "ResumeRequest",
    "RuleResult",
    "RunEvent",
    "RunSubmission",
    "StageSpec",
    "StreamKind",
    "StreamRecord",
    "Usage",
    "WorkflowSpec",
    "now_ms",
]


def now_ms() -> int:
    """Wall-clock time in epoch milliseconds, as the schemas' timestamp-millis."""
    return time.time_ns() // 1_000_000


class EventType(StrEnum):
    """What an event says happened. ``UNKNOWN`` is what a symbol from a newer schema reads as."""

    UNKNOWN = "UNKNOWN"
    RUN_STARTED = "RUN_STARTED"
    LEASE_ACQUIRED = "LEASE_ACQUIRED"
    STAGE_STARTED = "STAGE_STARTED"
    TOOL_CALLED = "TOOL_CALLED"
    TOOL_RESULT = "TOOL_RESULT"
    EFFECT_INTENT = "EFFECT_INTENT"
    EFFECT_RESULT = "EFFECT_RESULT"
    EFFECT_RECONCILED = "EFFECT_RECONCILED"
    VERIFIED = "VERIFIED"
    FAILED = "FAILED"
    RUN_BLOCKED = "RUN_BLOCKED"
    RUN_COMPLETED = "RUN_COMPLETED"
    RUN_BRANCHED = "RUN_BRANCHED"
    CALL_DIVERGED = "CALL_DIVERGED"
    """A resumed call differs from the recorded one at its position (tool or request hash)."""
    RUN_WAITING = "RUN_WAITING"
    """Stage code waits for a signal (``ctx.wait_for``): the writer let go of the run."""
    SIGNAL_RECEIVED = "SIGNAL_RECEIVED"
    """A signal a waiting run asked for (or its timeout's default): the wait's recorded result."""
    RUN_CANCELLED = "RUN_CANCELLED"
    """An operator cancelled the run (who and why in attributes); nothing moves it afterwards."""
    EFFECT_RESOLVED = "EFFECT_RESOLVED"
    """An operator closed an in-doubt effect: done (with its external id) or not done."""
    RUN_UPGRADED = "RUN_UPGRADED"
    """An operator moved the run to another workflow version (or definition): the run goes on from
    the checkpoint named in attributes (who, why, from, to) on the new code (``runlog upgrade``)."""


SUBJECT_ATTRIBUTE = "runlog.subject"
"""The attribute of ``RUN_STARTED`` naming the run's subject (a tenant or customer id, chosen by the
caller: ``Runner.run(..., subject=...)``) whose data key encrypts the run's payloads; absent: the default
subject. Readable metadata: an opaque id, never a name or an address."""

STAGES_ATTRIBUTE = "runlog.stages"
"""The attribute of ``RUN_STARTED`` (and ``RUN_UPGRADED``) holding the workflow's stage fingerprints:
a JSON object, stage name -> 16 hex digits (``runlog.producers.Stage.fingerprint``)."""


CHILD_TOOL = "runlog.child"
"""The tool name of a child run's position in its parent's stage (``ctx.start_child``): its
``TOOL_CALLED`` carries the child's run key as ``idempotency_key`` and the child's run id in the
attribute :data:`CHILD_RUN_ATTRIBUTE`; its recorded result is the child's outcome."""

CHILD_RUN_ATTRIBUTE = "runlog.child_run_id"
"""The attribute of a child call's ``TOOL_CALLED`` naming the child run."""

PARENT_CALL_ATTRIBUTE = "runlog.parent_call"
"""The attribute of a child run's ``RUN_STARTED`` naming the call of its parent (``parent_run_id``)
that started it (``<stage>/runlog.child/<index>``)."""

CHILDREN_ATTRIBUTE = "runlog.children"
"""The attribute of a ``RUN_WAITING`` for children (signal :data:`CHILD_TOOL`): the child run ids the
parent waits for, comma-separated; the parent is woken once all of them have ended."""


class ReplayPolicy(StrEnum):
    """What resume may do with a tool call that has no recorded result."""

    SAFE = "SAFE"
    """Run it again: it has no side effects worth protecting."""
    IDEMPOTENT = "IDEMPOTENT"
    """Reuse the recorded result, or call again with the same idempotency key."""
    RECONCILE_FIRST = "RECONCILE_FIRST"
    """Ask the external system first; execute only when it holds no result."""
    NEVER = "NEVER"
    """An intent without a result blocks the run for a person."""


class EffectStatus(StrEnum):
    """State of one effect in the ledger."""

    UNKNOWN = "UNKNOWN"
    INTENT = "INTENT"
    DONE = "DONE"
    RECONCILED = "RECONCILED"
    FAILED = "FAILED"


@dataclass(frozen=True, slots=True)
class ArtifactRef:
    """Content-addressed bytes stored outside the event."""

    uri: str
    sha256: str
    size: int
    media_type: str = "application/octet-stream"


@dataclass(frozen=True, slots=True)
class RuleResult:
    """The outcome of one named verification rule."""

    rule: str
    passed: bool
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class StageSpec:
    """A stage as recorded in ``RUN_STARTED``: its name, the inputs it reads, its rules."""

    name: str
    inputs: tuple[str, ...] = ()
    rules: tuple[str, ...] = ()
    checkpoint: bool = True


@dataclass(frozen=True, slots=True)
class WorkflowSpec:
    """The workflow definition a run was started with."""

    name: str
    version: str
    stages: tuple[StageSpec, ...]

    @property
    def stage_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.stages)

    def next_stage(self, after: str | None) -> str | None:
        """The stage that follows ``after`` (the first one when ``after`` is None)."""
        names = self.stage_names
        if after is None:
            return names[0] if names else None
        try:
            i = names.index(after)
        except ValueError:
            return None
        return names[i + 1] if i + 1 < len(names) else None

    def stage(self, name: str) -> StageSpec:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """Why something failed, as carried by ``FAILED`` and ``RUN_BLOCKED``."""

    kind: str
    message: str
    retryable: bool = False


@dataclass(frozen=True, slots=True)
class Usage:
    """What one model call spent (see ``run_event.avsc``, field ``usage``): tokens as the model's
    response counted them, and the cost the application's price table gives (None: no price known).

    Framework-neutral: any integration that calls a model can report one for its call
    (``Tool(usage=...)``); ``runlog.producers.pydantic_ai`` reads Pydantic AI's ``RequestUsage``."""

    model: str
    """The model asked, as the price table names it (``"openai:gpt-5.2"``)."""
    input_tokens: int = 0
    """All input tokens, cached ones included."""
    output_tokens: int = 0
    cache_read_tokens: int = 0
    """Input tokens read from the provider's cache (part of ``input_tokens``)."""
    cache_write_tokens: int = 0
    """Input tokens written to the provider's cache (part of ``input_tokens``)."""
    cost_nanos: int | None = None
    """The cost in billionths of a US dollar (``cost_nanos / 1e9`` dollars); None when the price
    table has no price for the model."""

    @property
    def cost(self) -> float | None:
        """The cost in US dollars (None: no price known)."""
        return None if self.cost_nanos is None else self.cost_nanos / 1e9


@dataclass(frozen=True, slots=True)
class RunEvent:
    """One immutable fact about a run (see ``run_event.avsc``)."""

    run_id: str
    seq: int
    epoch: int
    type: EventType
    occurred_at: int
    stage: str | None = None
    workflow: WorkflowSpec | None = None
    input_versions: Mapping[str, str] = field(default_factory=dict)
    payload_ref: ArtifactRef | None = None
    artifact_refs: tuple[ArtifactRef, ...] = ()
    tool: str | None = None
    call_id: str | None = None
    replay_policy: ReplayPolicy | None = None
    idempotency_key: str | None = None
    delivery_key: str | None = None
    target: str | None = None
    request_hash: str | None = None
    external_id: str | None = None
    verification: tuple[RuleResult, ...] = ()
    error: ErrorInfo | None = None
    parent_run_id: str | None = None
    forked_from_seq: int | None = None
    attributes: Mapping[str, str] = field(default_factory=dict)
    prev_hash: str | None = None
    """``event_hash`` of the run's previous accepted event (None at seq 1): the tamper-evident chain."""
    hash_version: int = 1
    """How this event's own hash is computed (:func:`runlog.schemas.event_hash`): 1, sha256 of its canonical
    JSON (the default: every event written before the field existed reads as 1); 2, sha256 of its
    Avro body as written. Runlog's writers set 2."""
    usage: Usage | None = None
    """What the call spent (``TOOL_RESULT`` of a call that reported it, a model request): tokens and
    cost, recorded once with the call's result, so a reused recorded result adds nothing."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The verified end of a stage: the resume point (see ``checkpoint.avsc``)."""

    checkpoint_id: str
    run_id: str
    last_seq: int
    partition: int
    offset: int
    stage: str
    created_at: int
    inputs: Mapping[str, str] = field(default_factory=dict)
    artifacts: tuple[ArtifactRef, ...] = ()
    verified_by: tuple[RuleResult, ...] = ()
    next_stage: str | None = None
    workflow_version: str = ""


@dataclass(frozen=True, slots=True)
class Effect:
    """One entry of the effects ledger (see ``effect.avsc``)."""

    delivery_key: str
    run_id: str
    target: str
    status: EffectStatus
    seq: int
    updated_at: int
    external_id: str | None = None
    tool: str | None = None
    stage: str | None = None


@dataclass(frozen=True, slots=True)
class ResumeRequest:
    """Asks the resumer group to continue a run (see ``resume_request.avsc``)."""

    run_id: str
    requested_at: int
    reason: str = ""
    requested_by: str | None = None
    seen_epoch: int | None = None
    """The run's lease epoch the requester saw: a resumer that finds a later one does nothing
    (outcome ``superseded``). None: unknown (requests written before the field, the sweep)."""


@dataclass(frozen=True, slots=True)
class RunSubmission:
    """Asks the workers of a fleet to start a run (see ``run_submission.avsc``):
    :meth:`runlog.Client.submit` writes it, ``runlog worker`` starts it."""

    run_id: str
    workflow: str
    params: str
    """Canonical JSON of the run's parameters."""
    idempotency_key: str
    submitted_at: int
    version: str | None = None
    inputs: dict[str, str] = field(default_factory=dict)
    queue: str = "default"
    priority: int = 0
    tenant: str | None = None
    submitted_by: str | None = None
    attributes: dict[str, str] = field(default_factory=dict)


class StreamKind(StrEnum):
    """What a stream record carries (see ``stream_record.avsc``). ``UNKNOWN``: a kind from a newer
    schema."""

    UNKNOWN = "UNKNOWN"
    BEGIN = "BEGIN"
    DELTA = "DELTA"
    EVENT = "EVENT"
    FINAL = "FINAL"
    SUPERSEDED = "SUPERSEDED"


@dataclass(frozen=True, slots=True)
class StreamRecord:
    """Partial output of a model call while it streams, on the streams topic keyed by run id (see
    ``stream_record.avsc``); not the run's state: the call's recorded result is what replay reuses."""

    run_id: str
    stage: str
    call_id: str
    epoch: int
    occurred_at: int
    kind: StreamKind
    attempt: int = 1
    index: int = 0
    part: int | None = None
    text: str | None = None
    data: str | None = None
    produced_ns: int = 0
    """``time.time_ns()`` of the writer when it produced the record."""
