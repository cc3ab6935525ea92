"""``runlog audit``: replay the events topic into a verified history of every run, with findings.

Delivery semantics: read-only. A consumer with a fresh group id (never
committed: ``enable.auto.commit`` is off and nothing commits) is *assigned*
the partitions and reads from the start of the range up to the high watermarks
taken when the audit starts; nothing is produced, live consumer groups are not
moved, and Redis is only read: the projection's anchors (below), read *before*
the watermarks are taken, so everything the projection had accepted was already
on the log the audit reads. Replaying the same range twice against the same
projection gives the same report.

Every run is folded with :func:`projections.fold` (the one fold) and checked:

* ``rejected_event`` — an event the fold refused (stale epoch of a fenced
  writer, a seq gap, a replayed seq), one finding per event, with why. Gapless
  seq and rising epochs are exactly what the fold accepts, so a gap or a falling
  epoch always shows up here.
* ``hash_chain`` — an accepted event whose ``prev_hash`` is not the
  :func:`schemas.event_hash` of the accepted event before it; the finding names
  the seq whose content no longer matches what its successor recorded (the
  edited event), or the seq after which the chain was cut.
* ``checkpoint_artifact`` — an artifact of a checkpoint missing from the
  artifact store (``RUNLOG_ARTIFACT_ROOT``) or hashing to something else; named
  by the first checkpoint that lists it.
* ``open_effect`` — an effect intent without a result or a reconcile in a run
  that is not ``RUNNING`` (completed, failed, blocked). A ``RUNNING`` run's open
  intents are listed in the report as open, not as findings: its writer (or the
  resumer) may still close them.
* ``effect_twice`` — more than one accepted ``EFFECT_RESULT`` for one delivery
  key within one run (resume executed an effect again). The same key in two
  runs is listed in the report (``shared_delivery_keys``) but is not a finding:
  two runs may deliver one object revision to different environments (the
  demo's two worlds do), and run-level idempotency is the run key's business.
* ``diverged`` — an accepted ``CALL_DIVERGED``: a resume ran stage code that made another
  call (other tool or other arguments) at the position of a recorded one; the recorded
  result was not handed back and the run blocked.
* ``undecodable`` — a record of the events topic that is not an event.
* ``truncated`` — the log ends before a seq the projection accepted: the run's
  tail (or, in a whole-topic audit, every event of the run) is missing from the
  log, or the projection was folded from another log.
* ``anchor_mismatch`` — the event at a seq the projection accepted hashes to
  something else on the log: it was changed after it was projected. This covers
  the last event of a run, which no ``prev_hash`` names, and a tail rewritten
  with a consistent chain.

The anchors: the hash chain alone cannot see the end of a run (nothing names
the last event's hash), so the projection keeps, outside the log, the seq and
``event_hash`` of the last event the fold accepted for each run (the run state's
``last_seq``/``last_hash``) and of each recent checkpoint's ``VERIFIED`` event
(``CheckpointEntry.last_hash``). :func:`audit` reads them from Redis
(``AuditOptions.anchors``) and compares them with the replayed chain. Each run
gets an ``anchor`` entry with a ``status``: ``ok`` (every anchor in the range
matches), ``truncated``, ``mismatch``, ``unchecked`` (the anchors are outside
the range read), ``no_anchor`` (a projection written before hashes existed:
nothing to compare, not a finding) or ``not_projected``. A run the projection
knows with no event on the log is reported ``truncated`` only by an audit of the
whole topic (no range). Without anchors (``--no-anchors``) the audit still sees
every edit that a later event's ``prev_hash`` names, gaps and cuts before an
event, but not a lost tail, a lost run, or an edited last event.

What people did is listed, not found: operator events (``EFFECT_RESOLVED``, ``RUN_CANCELLED``,
``SIGNAL_RECEIVED`` and the ``LEASE_ACQUIRED`` an operator took) carry ``by`` and ``why`` (also as
``reason`` when the fold gave none), ``decision`` and ``action`` in the run's event entries, and
each run lists them as ``operator_actions``. A resolved effect is closed, so it is no ``open_effect``.

A range audit (``--since`` or ``--from-offset``) folds a run that began before
the range from its first event in the range, trusting that event's seq, epoch
and ``prev_hash`` (the run is marked ``partial``); the rest is checked as usual.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from producers import LocalArtifactStore
from projections import OutcomeKind, ProjectionStore, RedisStore, RunState, RunStatus, fold
from schemas import (
    ArtifactError,
    ArtifactRef,
    Codec,
    DecodeError,
    EventType,
    RunEvent,
    RunlogError,
    Settings,
    Topics,
    partition_for,
)
from schemas._kafka import watermarks

__all__ = [
    "FINDING_KINDS",
    "Anchor",
    "AuditOptions",
    "AuditReport",
    "Auditor",
    "Finding",
    "RunAnchors",
    "RunAudit",
    "audit",
    "load_anchors",
    "read_records",
    "write_report",
]

FINDING_KINDS = ("rejected_event", "hash_chain", "checkpoint_artifact", "open_effect", "effect_twice",
                 "diverged", "undecodable", "truncated", "anchor_mismatch")

_WHY = {
    "stale_epoch": "fenced: written at an epoch below the run's current one (a writer whose lease "
                   "was taken over)",
    "lease_epoch_not_higher": "fenced: LEASE_ACQUIRED without a strictly higher epoch",
    "seq_gap": "out of order: seq skips ahead of the run's last accepted seq (a gap in the log)",
    "seq_replayed": "out of order: seq already taken by a different event",
}


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
    """The anchor check (see the module docstring); None when anchors were not checked."""
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
            [_effect_dict(e) for e in sorted([*s.open_effects.values(), *s.closed_effects.values()],
                                             key=lambda x: x.seq)],
            "open_intents": self.open_intents,
            "rejected": [e for e in self.events if e["outcome"].startswith("rejected")],
            "operator_actions": [e for e in self.events
                                 if e["outcome"] == OutcomeKind.ACCEPTED.value and e.get("by")],
            "findings": [f.to_dict() for f in self.findings],
            "events": self.events,
        }


def _effect_dict(e: Any) -> dict[str, Any]:
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


class Auditor:
    """The checks, as a plain object fed records in log order (no I/O until :meth:`finish`)."""

    def __init__(self, topic: str, options: AuditOptions | None = None, *,
                 codec: Codec | None = None, anchors: Mapping[str, RunAnchors] | None = None) -> None:
        """``anchors``: the projection's, read before the records (:func:`load_anchors`); None: not
        checked."""
        self.options = options or AuditOptions()
        self.codec = codec or Codec()
        self.report = AuditReport(topic, self.options)
        self.anchors = anchors
        self.report.anchors_checked = anchors is not None
        self._results: dict[str, list[tuple[str, int]]] = {}

    def feed(self, partition: int, offset: int, key: bytes | None, value: bytes | None) -> None:
        """One record of the events topic."""
        rep = self.report
        rep.records += 1
        run_key = key.decode("utf-8", "replace") if key is not None else ""
        if self.options.run_id is not None and run_key != self.options.run_id:
            return
        try:
            ev = self.codec.decode(value or b"", RunEvent)
        except DecodeError as err:
            rep.undecodable += 1
            rep.findings.append(Finding(run_key, "undecodable", f"offset {partition}:{offset}: "
                                        f"{err.reason}: {err}", None, offset))
            return
        rep.events += 1
        run = rep.runs.get(ev.run_id)
        if run is None:
            run = rep.runs[ev.run_id] = RunAudit(ev.run_id, partition)
            if self.options.ranged and ev.seq > 1:
                run.partial = True
                epoch = ev.epoch - 1 if ev.type is EventType.LEASE_ACQUIRED else ev.epoch
                run.state = RunState(run_id=ev.run_id, status=RunStatus.RUNNING, last_seq=ev.seq - 1,
                                     epoch=epoch, last_hash=ev.prev_hash)
        before = run.state
        expected = before.last_hash if before is not None else None
        state, out = fold(before, ev, (partition, offset))
        run.state = state
        entry = _entry(ev, partition, offset, out.kind.value, out.reason)
        run.events.append(entry)
        if out.kind is OutcomeKind.DUPLICATE:
            rep.duplicates += 1
            return
        if out.rejected:
            rep.rejected_events += 1
            reason = out.reason or "rejected"
            self._find(run, "rejected_event",
                       f"seq {ev.seq} epoch {ev.epoch} {ev.type.value} at offset {partition}:{offset} "
                       f"rejected ({reason}): {_WHY.get(reason, reason)}; the run was at seq "
                       f"{before.last_seq if before else 0} epoch {before.epoch if before else 0}",
                       ev.seq, offset)
            return
        entry["hash"] = state.last_hash
        if ev.prev_hash != expected:
            self._chain_break(run, ev, expected, offset)
        if out.checkpoint is not None:
            cp = out.checkpoint
            run.checkpoints.append({"checkpoint_id": cp.checkpoint_id, "stage": cp.stage,
                                    "last_seq": cp.last_seq, "offset": cp.offset,
                                    "next_stage": cp.next_stage,
                                    "artifacts": [{"uri": a.uri, "sha256": a.sha256, "size": a.size,
                                                   "media_type": a.media_type} for a in cp.artifacts]})
            for a in cp.artifacts:
                run._artifacts.append((cp.checkpoint_id, cp.last_seq, a))
        if ev.type is EventType.EFFECT_RESULT and ev.delivery_key is not None:
            self._results.setdefault(ev.delivery_key, []).append((ev.run_id, ev.seq))
        if ev.type is EventType.CALL_DIVERGED:
            attrs = ev.attributes
            was = _short(attrs.get("recorded_request_hash") or None)
            cid = attrs.get("recorded_call_id") or ev.call_id
            self._find(run, "diverged",
                       f"call {cid} diverged at seq {ev.seq}: recorded "
                       f"{attrs.get('recorded_tool') or '?'} request {was}, resumed code called {ev.tool} "
                       f"request {_short(ev.request_hash)}", ev.seq, offset)

    def _find(self, run: RunAudit, kind: str, detail: str, seq: int | None, offset: int | None) -> None:
        f = Finding(run.run_id, kind, detail, seq, offset)
        run.findings.append(f)
        self.report.findings.append(f)

    def _chain_break(self, run: RunAudit, ev: RunEvent, expected: str | None, offset: int) -> None:
        k = ev.seq - 1
        if ev.prev_hash is None:
            detail = (f"chain cut after seq {k}: seq {ev.seq} carries no prev_hash, seq {k} hashes to "
                      f"{_short(expected)}")
        elif expected is None:
            k = ev.seq
            detail = (f"seq {ev.seq} records prev_hash {_short(ev.prev_hash)} but no earlier event is "
                      "on the log: history before it was cut")
        else:
            detail = (f"chain broken at seq {k}: seq {ev.seq} records prev_hash {_short(ev.prev_hash)}, "
                      f"seq {k} hashes to {_short(expected)} (seq {k} was rewritten after seq {ev.seq} "
                      "was written)")
        self._find(run, "hash_chain", detail, k, offset)

    def finish(self, store: LocalArtifactStore | None = None) -> AuditReport:
        """Checks that need the whole range: open intents, effects executed twice, artifacts."""
        verified: dict[tuple[str, str], str | None] = {}
        for run in self.report.runs.values():
            s = run.state
            if s is None:
                continue
            for eff in s.open_intents:
                d = {**_effect_dict(eff), "run_status": s.status.value}
                run.open_intents.append(d)
                if s.status is not RunStatus.RUNNING:
                    self._find(run, "open_effect",
                               f"effect intent at seq {eff.seq} ({eff.tool or '?'} {eff.call_id or ''} -> "
                               f"{eff.target}, delivery key {eff.delivery_key[:16]}) has no result or "
                               f"reconcile, and the run is {s.status.value}", eff.seq, None)
            if store is not None and self.options.check_artifacts:
                seen: set[tuple[str, str]] = set()
                for cp_id, cp_seq, a in run._artifacts:
                    k = (a.uri, a.sha256)
                    if k in seen:
                        continue
                    seen.add(k)
                    if k not in verified:
                        verified[k] = _verify(store, a)
                    problem = verified[k]
                    if problem is not None:
                        self._find(run, "checkpoint_artifact",
                                   f"checkpoint {cp_id}: artifact {a.sha256[:16]} ({a.media_type}, "
                                   f"{a.uri}) {problem}", cp_seq, None)
        for dk, results in self._results.items():
            runs = sorted({r for r, _ in results})
            if len(runs) > 1:
                self.report.shared_delivery_keys[dk] = runs
            for i, (run_id, seq) in enumerate(results):
                first = next(s for r, s in results[:i + 1] if r == run_id)
                if first != seq:
                    self._find(self.report.runs[run_id], "effect_twice",
                               f"delivery key {dk[:16]} has another EFFECT_RESULT at seq {seq} (first at "
                               f"seq {first}): the effect was executed twice", seq, None)
        if self.anchors is not None:
            self._check_anchors(self.anchors)
        return self.report

    def _check_anchors(self, anchors: Mapping[str, RunAnchors]) -> None:
        o = self.options
        for run in list(self.report.runs.values()):
            run.anchor = self._anchor_of(run, anchors.get(run.run_id))
        if o.ranged or not o.to_the_end:
            return  # a run with no event in a range may have all of them outside it
        for run_id, ra in anchors.items():
            if (run_id in self.report.runs or (o.run_id is not None and run_id != o.run_id)
                    or not ra.anchors):  # projected before hashes: nothing to hold the log to
                continue
            run = self.report.runs[run_id] = RunAudit(run_id, ra.partition)
            top = max(ra.anchors, key=lambda a: a.seq)
            run.anchor = {"status": "truncated", "seq": top.seq, "hash": top.hash, "source": top.source,
                          "projected_seq": ra.last_seq, "log_last_seq": 0}
            self._find(run, "truncated",
                       f"no event of this run is on the log, but the projection accepted it up to seq "
                       f"{top.seq} (hash {_short(top.hash)}, {top.source}): the run's events were lost "
                       "from the log, or the projection was folded from another log", 1, None)

    def _anchor_of(self, run: RunAudit, ra: RunAnchors | None) -> dict[str, Any]:
        """Check one run's replayed chain against its anchors; the run's ``anchor`` entry."""
        last = run.state.last_seq if run.state is not None else 0
        if ra is None:
            return {"status": "not_projected", "log_last_seq": last}
        base: dict[str, Any] = {"projected_seq": ra.last_seq, "log_last_seq": last}
        if not ra.anchors:
            return {"status": "no_anchor", **base}
        replayed = {e["seq"]: e["hash"] for e in run.events
                    if e["outcome"] == OutcomeKind.ACCEPTED.value and "hash" in e}
        beyond = sorted((a for a in ra.anchors if a.seq > last), key=lambda a: -a.seq)
        wrong = sorted((a for a in ra.anchors if a.seq in replayed and replayed[a.seq] != a.hash),
                       key=lambda a: a.seq)
        checked = [a for a in ra.anchors if a.seq in replayed]
        top = max(ra.anchors, key=lambda a: a.seq)
        entry = {"seq": top.seq, "hash": top.hash, "source": top.source, "checked": len(checked), **base}
        status = "ok" if checked else "unchecked"
        if beyond and self.options.to_the_end:
            status = "truncated"
            a = beyond[0]
            self._find(run, "truncated",
                       f"the log ends at seq {last}, but the projection accepted seq {a.seq} (hash "
                       f"{_short(a.hash)}, {a.source}): seq {last + 1}..{a.seq} are missing from the log "
                       "(its tail was cut), or the projection was folded from another log", last + 1, None)
        if wrong:
            status = "mismatch" if status != "truncated" else status
            a = wrong[0]
            more = f"; {len(wrong) - 1} later anchor(s) differ too" if len(wrong) > 1 else ""
            self._find(run, "anchor_mismatch",
                       f"seq {a.seq} on the log hashes to {_short(replayed[a.seq])}, but the projection "
                       f"accepted {_short(a.hash)} at that seq ({a.source}): the event was changed after "
                       f"it was projected{more}", a.seq, None)
        return {"status": status, **entry}


def _verify(store: LocalArtifactStore, a: ArtifactRef) -> str | None:
    try:
        store.verify(a)
    except ArtifactError as err:
        return f"{type(err).__name__}: {err}"
    return None


def _short(h: str | None) -> str:
    return "null" if h is None else h[:16]


def _entry(ev: RunEvent, partition: int, offset: int, outcome: str, reason: str | None) -> dict[str, Any]:
    d: dict[str, Any] = {"seq": ev.seq, "epoch": ev.epoch, "type": ev.type.value, "stage": ev.stage,
                         "partition": partition, "offset": offset, "outcome": outcome, "reason": reason,
                         "occurred_at": ev.occurred_at}
    for k in ("call_id", "tool", "delivery_key", "external_id", "target"):
        v = getattr(ev, k)
        if v is not None:
            d[k] = v
    if ev.replay_policy is not None:
        d["policy"] = ev.replay_policy.value
    if ev.type is EventType.VERIFIED:
        d["passed"] = all(r.passed for r in ev.verification)
        d["rules"] = [r.rule for r in ev.verification]
        d["artifacts"] = len(ev.artifact_refs)
    if ev.error is not None:
        d["error"] = f"{ev.error.kind}: {ev.error.message}"
    if ev.type is EventType.LEASE_ACQUIRED:
        d["writer"] = ev.attributes.get("writer")
    a = ev.attributes
    who = a.get("by") or a.get("operator")
    if who:  # an operator's event: who acted and why (``reason`` unless the fold gave one)
        d["by"] = who
        if a.get("reason"):
            d["why"] = a["reason"]
            if d["reason"] is None:
                d["reason"] = a["reason"]
        for k in ("decision", "action"):
            if a.get(k):
                d[k] = a[k]
    return d


# -- reading the topic -------------------------------------------------------------------------


def _offset_at(c: Consumer, topic: str, p: int, ts: int) -> int:
    """First offset of partition ``p`` with a timestamp >= ``ts`` (-1: none)."""
    try:
        found = c.offsets_for_times([TopicPartition(topic, p, ts)], timeout=10)
    except KafkaException as err:
        raise RunlogError(f"looking up offsets by time on {topic}[{p}] failed: {err}") from err
    return int(found[0].offset)


def _plan(c: Consumer, settings: Settings, topic: str, o: AuditOptions) -> dict[int, tuple[int, int]]:
    try:
        md = c.list_topics(topic, timeout=10)
    except KafkaException as err:
        raise RunlogError(f"listing {topic!r} failed: {err}") from err
    tmd = md.topics.get(topic)
    if tmd is None or tmd.error is not None:
        raise RunlogError(f"topic {topic!r} not found")
    parts = sorted(tmd.partitions)
    if o.run_id is not None:
        parts = [partition_for(o.run_id, len(parts))]
    out: dict[int, tuple[int, int]] = {}
    for p in parts:
        lo, hi = watermarks(c, topic, [p])[p]
        start, end = lo, hi
        if o.from_offset is not None:
            start = max(start, o.from_offset)
        if o.to_offset is not None:
            end = min(end, o.to_offset)
        if o.since_ms is not None:
            at = _offset_at(c, topic, p, o.since_ms)
            start = end if at < 0 else max(start, at)
        if o.until_ms is not None:
            at = _offset_at(c, topic, p, o.until_ms + 1)
            if at >= 0:
                end = min(end, at)
        out[p] = (start, max(start, end))
    return out


def read_records(settings: Settings, options: AuditOptions | None = None, *,
                 progress: TextIO | None = None, plan_out: dict[int, tuple[int, int]] | None = None
                 ) -> Iterator[tuple[int, int, bytes | None, bytes | None]]:
    """``(partition, offset, key, value)`` of the events topic in the range, each partition in order.

    A fresh, never-committing consumer with assigned partitions (see the module docstring).
    ``plan_out`` receives each partition's ``(start, end)`` offsets.
    """
    o = options or AuditOptions()
    topic = Topics.of(settings).events
    conf = settings.consumer_config(f"runlog-audit-{uuid.uuid4().hex[:12]}",
                                    **{"enable.auto.commit": False, "enable.partition.eof": False,
                                       "fetch.max.bytes": 52_428_800})
    c = Consumer(conf)
    try:
        plan = _plan(c, settings, topic, o)
        if plan_out is not None:
            plan_out.update(plan)
        yield from _consume(c, topic, plan, progress)
    finally:
        c.close()


def _consume(c: Consumer, topic: str, plan: dict[int, tuple[int, int]],
             progress: TextIO | None) -> Iterator[tuple[int, int, bytes | None, bytes | None]]:
    todo = {p: end for p, (start, end) in plan.items() if end > start}
    total = sum(end - start for start, end in plan.values())
    done, started, shown = 0, time.monotonic(), 0.0
    if not todo:
        return
    c.assign([TopicPartition(topic, p, plan[p][0]) for p in todo])
    idle = 0.0
    while todo:
        try:
            msgs = c.consume(num_messages=2000, timeout=1.0)
        except KafkaException as err:
            raise RunlogError(f"consuming {topic!r} failed: {err}") from err
        if not msgs:
            idle += 1.0
            if idle > 60:
                raise RunlogError(f"no progress reading {topic!r} partitions {sorted(todo)}")
        else:
            idle = 0.0
        for m in msgs:
            kerr = m.error()
            if kerr is not None:
                if kerr.code() == KafkaError._PARTITION_EOF:
                    continue
                raise RunlogError(f"consuming {topic!r} failed: {kerr}")
            p, off = m.partition(), m.offset()
            end = todo.get(p)
            if end is None or off >= end:
                continue
            done += 1
            yield p, off, m.key(), m.value()
            if off >= end - 1:
                del todo[p]
        if todo:
            for tp in c.position([TopicPartition(topic, p) for p in todo]):
                if tp.offset >= 0 and tp.offset >= todo.get(tp.partition, 0):
                    todo.pop(tp.partition, None)
        now = time.monotonic()
        if progress is not None and (now - shown > 0.5 or not todo):
            shown = now
            frac = done / total if total else 1.0
            bar = "#" * int(frac * 30)
            progress.write(f"\raudit [{bar:<30}] {done}/{total} records "
                           f"{done / max(now - started, 1e-6):,.0f}/s")
            progress.flush()
    if progress is not None:
        progress.write("\n")
        progress.flush()


def audit(settings: Settings, options: AuditOptions | None = None, *,
          progress: TextIO | None = sys.stderr, projection: ProjectionStore | None = None) -> AuditReport:
    """Replay the range of the events topic and check it (see the module docstring).

    With ``options.anchors`` (the default) the anchors are read from ``projection``, by default the
    Redis namespace of ``settings``, before the topic is.

    Raises:
        ProjectionStoreError: the projection cannot be read (audit without anchors to go on).
    """
    o = options or AuditOptions()
    t0 = time.monotonic()
    anchors = None
    if o.anchors:
        store = projection if projection is not None else RedisStore.from_settings(settings)
        try:
            anchors = load_anchors(store, o.run_id)
        finally:
            if projection is None and isinstance(store, RedisStore):
                store.client.close()
    auditor = Auditor(Topics.of(settings).events, o, codec=Codec.from_settings(settings),
                      anchors=anchors)
    for p, off, key, value in read_records(settings, o, progress=progress, plan_out=auditor.report.ranges):
        auditor.feed(p, off, key, value)
    report = auditor.finish(LocalArtifactStore(settings.artifact_root))
    report.seconds = time.monotonic() - t0
    return report


def write_report(report: AuditReport, out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``audit.json`` and ``audit.html`` (self-contained) into ``out_dir``; returns both paths."""
    from processors._audit_html import render_html

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    doc = report.to_dict()
    jp, hp = out / "audit.json", out / "audit.html"
    jp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    hp.write_text(render_html(doc), encoding="utf-8")
    return jp, hp
