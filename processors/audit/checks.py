"""The audit's checks: :class:`Auditor`, fed the events topic's records in log order, folds every
run with the one fold and records each finding (the kinds and what they mean are described in
:mod:`runlog.processors.audit`); :meth:`Auditor.finish` runs the checks that need the whole range (open
intents, effects executed twice, checkpoint artifacts, the projection's anchors). No I/O but the
artifact store's reads in :meth:`~Auditor.finish`."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runlog.processors.audit.report import (
    AuditOptions,
    AuditReport,
    Finding,
    RunAnchors,
    RunAudit,
    effect_dict,
)
from runlog.processors.inspect.payloads import redact_text
from runlog.processors.inspect.upgrades import describe_upgrade
from runlog.producers import LocalArtifactStore
from runlog.producers.internal import label
from runlog.projections import OutcomeKind, RunState, RunStatus, fold
from runlog.schemas import (
    ArtifactError,
    ArtifactMissing,
    ArtifactRef,
    Codec,
    DecodeError,
    EventType,
    RunEvent,
    event_hash,
)

__all__ = ["AuditPartial", "Auditor"]


@dataclass(frozen=True)
class AuditPartial:
    """An auditor's findings from the records it was fed, before the checks that need every run
    (:meth:`Auditor.partial`, :meth:`Auditor.merged`)."""

    report: AuditReport
    results: dict[str, list[tuple[str, int]]]
    """Accepted ``EFFECT_RESULT`` events by delivery key: (run id, seq), in log order per run."""
    seconds: float = 0.0
    """How long the worker took to read and feed its records (its process's start not included)."""

_WHY = {
    "stale_epoch": "fenced: written at an epoch below the run's current one (a writer whose lease "
                   "was taken over)",
    "lease_epoch_not_higher": "fenced: LEASE_ACQUIRED without a strictly higher epoch",
    "seq_gap": "out of order: seq skips ahead of the run's last accepted seq (a gap in the log)",
    "seq_replayed": "out of order: seq already taken by a different event",
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
            ev, body = self.codec.decode_with_body(value or b"", RunEvent)
        except DecodeError as err:
            rep.undecodable += 1
            rep.findings.append(Finding(run_key, "undecodable", f"offset {partition}:{offset}: "
                                        f"{err.reason}: {err}", None, offset, partition))
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
        # hashed from the bytes as read (a version-2 event's body), never a re-encoding
        state, out = fold(before, ev, (partition, offset), content_hash=event_hash(ev, body))
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
                                    "artifacts": [{"uri": label(a), "sha256": a.sha256, "size": a.size,
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
        f = Finding(run.run_id, kind, detail, seq, offset, run.partition)
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

    def partial(self, seconds: float = 0.0) -> AuditPartial:
        """What this auditor found from the records it was fed, before :meth:`finish`: the part a
        worker of a parallel audit sends back (:meth:`merged`), with the ``seconds`` it took."""
        return AuditPartial(self.report, self._results, seconds)

    @classmethod
    def merged(cls, topic: str, parts: Sequence[AuditPartial], options: AuditOptions | None = None, *,
               codec: Codec | None = None, anchors: Mapping[str, RunAnchors] | None = None) -> Auditor:
        """One auditor holding the partial results of auditors fed disjoint sets of partitions (a run
        is on one partition, so their runs are disjoint): :meth:`finish` then reports what one
        auditor fed every record would have, in the same order."""
        a = cls(topic, options, codec=codec, anchors=anchors)
        rep = a.report
        rep.worker_seconds = [p.seconds for p in parts]
        for part in parts:
            r = part.report
            rep.records += r.records
            rep.events += r.events
            rep.rejected_events += r.rejected_events
            rep.duplicates += r.duplicates
            rep.undecodable += r.undecodable
            rep.findings.extend(r.findings)
            rep.ranges.update(r.ranges)
            for run_id, run in r.runs.items():
                if run_id in rep.runs:
                    raise ValueError(f"run {run_id!r} is in two partial audits: they must not share a "
                                     "partition")
                rep.runs[run_id] = run
            for dk, results in part.results.items():
                a._results.setdefault(dk, []).extend(results)
        return a

    def _canonical(self) -> None:
        """Put what the feed collected in log order per partition, partitions in order (a reader
        interleaves partitions as their fetches come back; the report must not depend on that)."""
        rep = self.report

        def first_offset(run: RunAudit) -> int:
            return int(run.events[0]["offset"]) if run.events else -1

        rep.runs = dict(sorted(rep.runs.items(), key=lambda kv: (kv[1].partition, first_offset(kv[1]))))
        rep.findings.sort(key=lambda f: (-1 if f.partition is None else f.partition,
                                         -1 if f.offset is None else f.offset))
        part_of = {r: run.partition for r, run in rep.runs.items()}
        self._results = {dk: sorted(res, key=lambda x: part_of.get(x[0], -1))
                         for dk, res in sorted(self._results.items())}

    def finish(self, store: LocalArtifactStore | None = None,
               erased: Collection[str] = frozenset()) -> AuditReport:
        """Checks that need the whole range: open intents, effects executed twice, artifacts. The
        artifacts of ``erased`` runs (``runlog erase``, which sweeps them) may be missing; any other
        problem with them is still a finding."""
        self._canonical()
        verified: dict[tuple[str, str], ArtifactError | None] = {}
        for run_id, run in self.report.runs.items():
            s = run.state
            if s is None:
                continue
            for eff in s.open_intents:
                d = {**effect_dict(eff), "run_status": s.status.value}
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
                    swept = run_id in erased and isinstance(problem, ArtifactMissing)
                    if problem is not None and not swept:
                        self._find(run, "checkpoint_artifact",
                                   f"checkpoint {cp_id}: artifact {a.sha256[:16]} ({a.media_type}, "
                                   f"{label(a)}) {type(problem).__name__}: {problem}", cp_seq, None)
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


def _verify(store: LocalArtifactStore, a: ArtifactRef) -> ArtifactError | None:
    try:
        store.verify(a)
    except ArtifactError as err:
        return err
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
    if ev.error is not None:  # a sealed message reads [sealed]: an audit report opens no payload
        d["error"] = redact_text(f"{ev.error.kind}: {ev.error.message}")
    if ev.type is EventType.LEASE_ACQUIRED:
        d["writer"] = ev.attributes.get("writer")
    a = ev.attributes
    who = a.get("by") or a.get("operator")
    if who:  # an operator's event: who acted and why (``reason`` unless the fold gave one)
        d["by"] = who
        if a.get("reason"):
            d["why"] = redact_text(a["reason"])
            if d["reason"] is None:
                d["reason"] = d["why"]
        for k in ("decision", "action"):
            if a.get(k):
                d[k] = a[k]
    if ev.type is EventType.RUN_UPGRADED:  # what the upgrade kept and re-ran, beside who and why
        d["action"] = describe_upgrade(a)
    return d
