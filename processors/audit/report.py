"""What ``runlog audit`` reports, as data: the options of an audit, its findings, each run's
history and anchors, and the whole report with its JSON form (rendered to HTML by
:mod:`runlog.processors.audit.html`). The checks that fill it are in :mod:`runlog.processors.audit.checks`;
reading the topic and the finding kinds are described in :mod:`runlog.processors.audit`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runlog.projections import OutcomeKind, ProjectionStore, RunState, RunStatus
from runlog.schemas import ArtifactRef, EventType

__all__ = [
    "FINDING_KINDS",
    "Anchor",
    "AuditOptions",
    "AuditReport",
    "Finding",
    "RunAnchors",
    "RunAudit",
    "effect_dict",
    "load_anchors",
]

FINDING_KINDS = ("rejected_event", "hash_chain", "checkpoint_artifact", "open_effect", "effect_twice",
                 "diverged", "undecodable", "truncated", "anchor_mismatch")


@dataclass(frozen=True)
class AuditOptions:
    """What to replay. Offsets apply to every partition read; times are record timestamps (ms)."""

    run_id: str | None = None
    from_offset: int | None = None
    """First offset read (inclusive)."""
    to_offset: int | None = None
    """Stop before this offset (exclusive)."""
    since_ms: int | None = None
    until_ms: int | None = None
    """Last record timestamp included (inclusive)."""
    check_artifacts: bool = True
    anchors: bool = True
    """Compare each run's chain with the anchors the projection (Redis) holds."""

    @property
    def ranged(self) -> bool:
        return self.from_offset is not None or self.since_ms is not None

    @property
    def to_the_end(self) -> bool:
        """The range ends at the high watermarks: a run's last event read is its last on the log."""
        return self.to_offset is None and self.until_ms is None


@dataclass(frozen=True)
class Finding:
    """One thing the audit found wrong: ``kind`` is one of :data:`FINDING_KINDS`."""

    run_id: str
    kind: str
    detail: str
    seq: int | None = None
    offset: int | None = None
    partition: int | None = field(default=None, compare=False)
    """The partition the run (or the undecodable record) is on: the order of a report's findings
    is by partition, then offset, however the partitions' records interleaved as they were read."""

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "kind": self.kind, "detail": self.detail, "seq": self.seq,
                "offset": self.offset}


@dataclass(frozen=True)
class Anchor:
    """A seq of a run and the ``event_hash`` its event had when the projection accepted it."""

    seq: int
    hash: str
    source: str
    """Where it is held: ``run state``, or ``checkpoint <id>``."""


@dataclass(frozen=True)
class RunAnchors:
    """What the projection holds of a run's chain (``anchors`` empty: projected before hashes)."""

    run_id: str
    partition: int
    last_seq: int
    """The last seq the projection accepted (with or without a hash)."""
    anchors: tuple[Anchor, ...] = ()

    @classmethod
    def of(cls, state: RunState) -> RunAnchors:
        out = []
        if state.anchor is not None:
            out.append(Anchor(*state.anchor, "run state"))
        out.extend(Anchor(c.last_seq, c.last_hash, f"checkpoint {c.checkpoint_id}")
                   for c in state.checkpoints if c.last_hash is not None and c.last_seq > 0)
        return cls(state.run_id, state.partition, state.last_seq, tuple(out))


def load_anchors(store: ProjectionStore, run_id: str | None = None, *,
                 chunk: int = 500) -> dict[str, RunAnchors]:
    """Every projected run's anchors (only ``run_id``'s when given), by run id.

    Raises:
        ProjectionStoreError: the store cannot be read.
    """
    ids = [run_id] if run_id is not None else list(dict.fromkeys(store.runs()))
    out: dict[str, RunAnchors] = {}
    for i in range(0, len(ids), chunk):
        for rid, state in store.load_states(ids[i:i + chunk]).items():
            out[rid] = RunAnchors.of(state)
    return out


@dataclass
class RunAudit:
    """One run as the audit saw it: every event with the fold's verdict, stages, checkpoints, effects."""

    run_id: str
    partition: int
    partial: bool = False
    state: RunState | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    open_intents: list[dict[str, Any]] = field(default_factory=list)
    anchor: dict[str, Any] | None = None
    """The anchor check (see :mod:`runlog.processors.audit`); None when anchors were not checked."""
    _artifacts: list[tuple[str, int, ArtifactRef]] = field(default_factory=list)

    @property
    def status(self) -> str:
        return self.state.status.value if self.state is not None else RunStatus.PENDING.value

    def stages(self) -> list[dict[str, Any]]:
        """Stage blocks in log order: each ``STAGE_STARTED`` to its ``VERIFIED``/``FAILED`` (or the
        next lease change, when the writer died inside it)."""
        out: list[dict[str, Any]] = []
        cur: dict[str, Any] | None = None
        for e in self.events:
            if e["outcome"] != OutcomeKind.ACCEPTED.value:
                continue
            t = e["type"]
            if t == EventType.STAGE_STARTED.value:
                if cur is not None:
                    cur["outcome"] = "interrupted"
                cur = {"stage": e["stage"], "from_seq": e["seq"], "to_seq": e["seq"], "epoch": e["epoch"],
                       "outcome": "open"}
                out.append(cur)
            elif cur is not None:
                cur["to_seq"] = e["seq"]
                if t == EventType.VERIFIED.value:
                    cur["outcome"] = "verified" if e.get("passed", True) else "failed"
                    cur = None
                elif t == EventType.FAILED.value and not e.get("call_id"):
                    cur["outcome"] = "failed"
                    cur = None
                elif t == EventType.LEASE_ACQUIRED.value:
                    cur["outcome"] = "interrupted"
                    cur["to_seq"] = e["seq"] - 1
                    cur = None
        return out

    def to_dict(self) -> dict[str, Any]:
        s = self.state
        return {
            "run_id": self.run_id,
            "partition": self.partition,
            "partial": self.partial,
            "status": self.status,
            "workflow": None if s is None or s.workflow is None else
            {"name": s.workflow.name, "version": s.workflow.version,
             "stages": list(s.workflow.stage_names)},
            "parent_run_id": None if s is None else s.parent_run_id,
            "last_seq": 0 if s is None else s.last_seq,
            "epoch": 0 if s is None else s.epoch,
            "last_hash": None if s is None else s.last_hash,
            "anchor": self.anchor,
            "completed_stages": [] if s is None else list(s.completed_stages),
            "stages": self.stages(),
            "checkpoints": self.checkpoints,
            "effects": [] if s is None else
            [effect_dict(e) for e in sorted([*s.open_effects.values(), *s.closed_effects.values()],
                                             key=lambda x: x.seq)],
            "open_intents": self.open_intents,
            "rejected": [e for e in self.events if e["outcome"].startswith("rejected")],
            "operator_actions": [e for e in self.events
                                 if e["outcome"] == OutcomeKind.ACCEPTED.value and e.get("by")],
            "findings": [f.to_dict() for f in self.findings],
            "events": self.events,
        }


def effect_dict(e: Any) -> dict[str, Any]:
    """An effect of the run state as the report lists it."""
    return {"delivery_key": e.delivery_key, "target": e.target, "status": e.status.value, "seq": e.seq,
            "call_id": e.call_id, "tool": e.tool, "stage": e.stage, "external_id": e.external_id,
            "replay_policy": None if e.replay_policy is None else e.replay_policy.value}


@dataclass
class AuditReport:
    """The whole audit: per-run histories and every finding, in log order within a run."""

    topic: str
    options: AuditOptions
    runs: dict[str, RunAudit] = field(default_factory=dict)
    records: int = 0
    events: int = 0
    rejected_events: int = 0
    duplicates: int = 0
    undecodable: int = 0
    findings: list[Finding] = field(default_factory=list)
    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)
    shared_delivery_keys: dict[str, list[str]] = field(default_factory=dict)
    """Delivery keys with an ``EFFECT_RESULT`` in more than one run (not findings)."""
    seconds: float = 0.0
    anchors_checked: bool = False
    worker_seconds: list[float] = field(default_factory=list)
    """A parallel audit's workers: how long each read and fed its partitions (not in the report's JSON)."""
    erased: list[str] = field(default_factory=list)
    """Runs whose subject was erased: payloads destroyed on purpose, not a finding (chains verified)."""

    def anchor_counts(self) -> dict[str, int] | None:
        """Runs by anchor status (None when anchors were not checked)."""
        if not self.anchors_checked:
            return None
        out: dict[str, int] = {}
        for r in self.runs.values():
            status = r.anchor["status"] if r.anchor is not None else "not_checked"
            out[status] = out.get(status, 0) + 1
        return dict(sorted(out.items()))

    def summary(self) -> dict[str, Any]:
        """The ``--json`` object."""
        return {"runs": len(self.runs), "events": self.events, "rejected_events": self.rejected_events,
                "findings": [{"run_id": f.run_id, "kind": f.kind, "detail": f.detail, "seq": f.seq}
                             for f in self.findings],
                "records": self.records, "duplicates": self.duplicates, "undecodable": self.undecodable,
                "erased": list(self.erased),
                "anchors": self.anchor_counts()}

    def to_dict(self) -> dict[str, Any]:
        o = self.options
        return {
            **self.summary(),
            "findings": [f.to_dict() for f in self.findings],
            "topic": self.topic,
            "range": {"run_id": o.run_id, "from_offset": o.from_offset, "to_offset": o.to_offset,
                      "since_ms": o.since_ms, "until_ms": o.until_ms,
                      "partitions": {str(p): list(r) for p, r in sorted(self.ranges.items())}},
            "seconds": round(self.seconds, 3),
            "shared_delivery_keys": self.shared_delivery_keys,
            "runs": [r.to_dict() for r in self.runs.values()],
        }
