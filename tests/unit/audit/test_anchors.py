"""Anchors of the hash chain: what the projection keeps of each run's chain, and the audit's checks
of the log against them (pure: the auditor fed encoded records, anchors from a MemoryStore)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from runlog.processors.audit import AuditOptions, Auditor, RunAnchors, load_anchors
from runlog.projections import MemoryStore, RunState, RunUpdate, fold_all
from runlog.schemas import Codec, EventType, RunEvent, event_hash
from tests.unit.audit.test_auditor import run

CODEC = Codec()


def pre_anchor(state: RunState) -> RunState:
    """``state`` as a projection written before the anchors existed stored it: no ``last_hash``,
    checkpoint entries of five items."""
    doc = json.loads(state.to_json())
    del doc["last_hash"]
    doc["checkpoints"] = [c[:5] for c in doc["checkpoints"]]
    return RunState.from_json(json.dumps(doc))


def projection(*runs: list[RunEvent], old: bool = False) -> dict[str, RunAnchors]:
    """Anchors as :func:`load_anchors` reads them from a store the given logs were folded into."""
    store = MemoryStore()
    for events in runs:
        state = fold_all((e, (0, i)) for i, e in enumerate(events))
        assert state is not None
        store.apply([RunUpdate(pre_anchor(state) if old else state)])
    return load_anchors(store)


def audit_of(events: list[RunEvent], anchors: dict[str, RunAnchors] | None,
             options: AuditOptions | None = None) -> Auditor:
    a = Auditor("events", options, anchors=anchors)
    for off, ev in enumerate(events):
        a.feed(0, off, ev.run_id.encode(), CODEC.encode(ev))
    a.finish()
    return a


def found(a: Auditor) -> list[tuple[str, str, int | None]]:
    return [(f.run_id, f.kind, f.seq) for f in a.report.findings]


def anchor(a: Auditor, run_id: str) -> dict[str, Any]:
    entry = a.report.runs[run_id].anchor
    assert entry is not None
    return entry


# -- what the projection keeps ---------------------------------------------------------------------


def test_state_and_checkpoint_entries_carry_the_hash_of_their_seq() -> None:
    events = run("r1")
    state = fold_all(events)
    assert state is not None
    assert state.anchor == (len(events), event_hash(events[-1]))
    verified = {e.seq: event_hash(e) for e in events if e.type is EventType.VERIFIED}
    assert {c.last_seq: c.last_hash for c in state.checkpoints} == verified
    assert RunState.from_json(state.to_json()) == state  # the sixth item of an entry round-trips
    anchors = RunAnchors.of(state)
    assert [(a.seq, a.source) for a in anchors.anchors] == [
        (len(events), "run state"),
        *[(c.last_seq, f"checkpoint {c.checkpoint_id}") for c in state.checkpoints]]


def test_state_json_from_before_the_anchors_loads_without_them() -> None:
    state = fold_all(run("r1"))
    assert state is not None
    old = pre_anchor(state)
    assert old.last_hash is None and old.anchor is None
    assert [c.last_hash for c in old.checkpoints] == [None, None]
    assert [c.last_seq for c in old.checkpoints] == [c.last_seq for c in state.checkpoints]
    assert RunAnchors.of(old).anchors == ()


# -- the audit's checks ----------------------------------------------------------------------------


def test_an_untouched_run_matches_its_anchors() -> None:
    events = run("r1") + run("r2")
    a = audit_of(events, projection(run("r1"), run("r2")))
    assert found(a) == []
    assert anchor(a, "r1")["status"] == "ok" and anchor(a, "r1")["checked"] == 3  # state + 2 checkpoints
    assert a.report.summary()["anchors"] == {"ok": 2}


def test_a_cut_tail_is_truncated_from_the_first_missing_seq() -> None:
    full = run("r1")
    for keep in (len(full) - 1, 3):
        a = audit_of(full[:keep], projection(full))
        assert found(a) == [("r1", "truncated", keep + 1)], keep
        detail = a.report.findings[0].detail
        assert f"the log ends at seq {keep}" in detail and f"projection accepted seq {len(full)}" in detail
        assert anchor(a, "r1")["status"] == "truncated"


def test_an_edited_last_event_is_an_anchor_mismatch_the_chain_cannot_see() -> None:
    events = run("r1")
    edited = [*events[:-1], dataclasses.replace(events[-1], occurred_at=1)]  # same seq and prev_hash
    assert found(audit_of(edited, None)) == []  # the chain alone: nothing names the last event
    a = audit_of(edited, projection(events))
    assert found(a) == [("r1", "anchor_mismatch", len(events))]
    assert "(run state)" in a.report.findings[0].detail
    assert anchor(a, "r1")["status"] == "mismatch"


def test_a_tail_rewritten_with_a_consistent_chain_is_an_anchor_mismatch() -> None:
    events = run("r1")
    forged, prev = list(events[:4]), event_hash(events[3])
    for ev in events[4:]:
        forged.append(dataclasses.replace(ev, occurred_at=ev.occurred_at + 1, prev_hash=prev))
        prev = event_hash(forged[-1])
    assert found(audit_of(forged, None)) == []
    a = audit_of(forged, projection(events))
    # the checkpoint at seq 3 still matches; the first anchor after the rewrite is named
    first_after = min(c for c in (e.seq for e in events if e.type is EventType.VERIFIED) if c > 4)
    assert found(a) == [("r1", "anchor_mismatch", first_after)]
    assert "1 later anchor(s) differ too" in a.report.findings[0].detail


def test_a_run_missing_from_the_log_is_truncated_only_in_a_whole_topic_audit() -> None:
    anchors = projection(run("r1"), run("gone"))
    a = audit_of(run("r1"), anchors)
    assert found(a) == [("gone", "truncated", 1)]
    assert "no event of this run is on the log" in a.report.findings[0].detail
    assert a.report.runs["gone"].to_dict()["events"] == []
    for opts in (AuditOptions(from_offset=0), AuditOptions(to_offset=100), AuditOptions(run_id="r1")):
        assert found(audit_of(run("r1"), anchors, opts)) == [], opts
    assert found(audit_of([], anchors, AuditOptions(run_id="gone"))) == [("gone", "truncated", 1)]


def test_a_range_that_ends_early_checks_what_it_read_and_finds_no_truncation() -> None:
    events = run("r1")
    a = audit_of(events[:3], projection(events), AuditOptions(to_offset=3))
    assert found(a) == []
    assert anchor(a, "r1")["status"] == "ok" and anchor(a, "r1")["checked"] == 1  # checkpoint at seq 3
    b = audit_of(events[:2], projection(events), AuditOptions(to_offset=2))
    assert found(b) == [] and anchor(b, "r1")["status"] == "unchecked"


def test_a_lagging_projection_anchors_what_it_had() -> None:
    events = run("r1")
    a = audit_of(events, projection(events[:5]))
    assert found(a) == []
    assert anchor(a, "r1") | {"hash": None} == {"status": "ok", "seq": 5, "hash": None, "source": "run state",
                                               "checked": 2, "projected_seq": 5, "log_last_seq": len(events)}


def test_pre_anchor_projections_say_no_anchor_and_find_nothing() -> None:
    events = run("r1")
    for log in (events, events[:-1]):
        a = audit_of(log, projection(events, old=True))
        assert found(a) == []
        assert anchor(a, "r1")["status"] == "no_anchor"
    missing = audit_of(run("r2"), projection(run("r2"), events, old=True))
    assert found(missing) == [] and set(missing.report.runs) == {"r2"}


def test_runs_the_projection_does_not_know_and_audits_without_anchors() -> None:
    a = audit_of(run("r1"), {})
    assert found(a) == [] and anchor(a, "r1") == {"status": "not_projected", "log_last_seq": 8}
    b = audit_of(run("r1"), None)
    assert b.report.runs["r1"].anchor is None and b.report.summary()["anchors"] is None
