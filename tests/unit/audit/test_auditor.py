"""The audit's checks as a pure object fed encoded records (no broker)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from runlog.processors.audit import AuditOptions, Auditor
from runlog.processors.audit.html import render_html
from runlog.producers import LocalArtifactStore
from runlog.schemas import Codec, EventType, ReplayPolicy, RunEvent, StageSpec, WorkflowSpec, event_hash

CODEC = Codec()
WF = WorkflowSpec("wf", "1", (StageSpec("a"), StageSpec("b")))


def run(run_id: str, *, effect_results: int = 1, complete: bool = True,
        store: LocalArtifactStore | None = None) -> list[RunEvent]:
    """A small two-stage run with one effect, chained like a writer chains it."""
    art = store.put(b"output of a") if store is not None else None
    specs: list[dict[str, object]] = [
        {"type": EventType.RUN_STARTED, "workflow": WF},
        {"type": EventType.STAGE_STARTED, "stage": "a"},
        {"type": EventType.VERIFIED, "stage": "a", "artifact_refs": (art,) if art else ()},
        {"type": EventType.STAGE_STARTED, "stage": "b"},
        {"type": EventType.EFFECT_INTENT, "stage": "b", "delivery_key": f"dk-{run_id}", "target": "t",
         "call_id": "b/x/0", "tool": "x", "replay_policy": ReplayPolicy.IDEMPOTENT},
        *[{"type": EventType.EFFECT_RESULT, "stage": "b", "delivery_key": f"dk-{run_id}", "call_id": "b/x/0",
           "external_id": f"e{i}"} for i in range(effect_results)],
    ]
    if complete:
        specs += [{"type": EventType.VERIFIED, "stage": "b"}, {"type": EventType.RUN_COMPLETED}]
    out, prev = [], None
    for seq, spec in enumerate(specs, 1):
        ev = RunEvent(run_id, seq, 1, occurred_at=100 + seq, prev_hash=prev, **spec)  # type: ignore[arg-type]
        prev = event_hash(ev)
        out.append(ev)
    return out


def feed(events: list[RunEvent], options: AuditOptions | None = None,
         store: LocalArtifactStore | None = None, erased: frozenset[str] = frozenset()) -> Auditor:
    a = Auditor("events", options)
    for off, ev in enumerate(events):
        a.feed(0, off, ev.run_id.encode(), CODEC.encode(ev))
    a.finish(store, erased=erased)
    return a


def kinds(a: Auditor) -> list[tuple[str, str, int | None]]:
    return [(f.run_id, f.kind, f.seq) for f in a.report.findings]


def test_clean_runs_have_no_findings(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path)
    a = feed(run("r1", store=store) + run("r2", store=store), store=store)
    assert kinds(a) == []
    assert a.report.summary()["runs"] == 2 and a.report.events == 16
    assert [b["outcome"] for b in a.report.runs["r1"].stages()] == ["verified", "verified"]


def test_a_rewritten_event_breaks_the_chain_at_its_seq() -> None:
    events = run("r1")
    events[3] = dataclasses.replace(events[3], occurred_at=1)  # same seq, changed content
    assert kinds(feed(events)) == [("r1", "hash_chain", 4)]


def test_a_missing_prev_hash_cuts_the_chain() -> None:
    events = run("r1")
    events[2] = dataclasses.replace(events[2], prev_hash=None)
    found = feed(events).report.findings
    # seq 3 has no prev_hash (cut after 2), and its changed content no longer matches seq 4's record
    assert [(f.kind, f.seq) for f in found] == [("hash_chain", 2), ("hash_chain", 3)]
    assert "chain cut after seq 2" in found[0].detail


def test_rejected_events_are_findings_with_why() -> None:
    events = run("r1")
    zombie = dataclasses.replace(events[4], seq=len(events) + 1, epoch=0)
    gap = dataclasses.replace(events[4], seq=len(events) + 5)
    a = feed([*events, zombie, gap])
    assert kinds(a) == [("r1", "rejected_event", zombie.seq), ("r1", "rejected_event", gap.seq)]
    assert "stale_epoch" in a.report.findings[0].detail and "seq_gap" in a.report.findings[1].detail
    assert a.report.rejected_events == 2


def test_duplicates_are_not_findings() -> None:
    events = run("r1")
    a = feed([*events[:3], events[2], *events[3:]])
    assert kinds(a) == [] and a.report.duplicates == 1


def test_open_intents_are_findings_only_when_the_run_is_not_running() -> None:
    running = run("r1", effect_results=0, complete=False)
    assert kinds(feed(running)) == []
    assert len(feed(running).report.runs["r1"].open_intents) == 1
    blocked = [*running, RunEvent("r1", len(running) + 1, 1, EventType.RUN_BLOCKED, 999,
                                  prev_hash=event_hash(running[-1]))]
    assert kinds(feed(blocked)) == [("r1", "open_effect", 5)]


def test_an_effect_executed_twice_in_a_run_is_a_finding() -> None:
    assert kinds(feed(run("r1", effect_results=2))) == [("r1", "effect_twice", 7)]


def test_the_same_delivery_key_in_two_runs_is_listed_not_a_finding() -> None:
    a, b = run("r1"), run("r2")
    b = [dataclasses.replace(e, delivery_key="dk-r1") if e.delivery_key else e for e in b]
    prev = None
    for i, e in enumerate(b):  # re-chain after the edit
        b[i] = dataclasses.replace(e, prev_hash=prev)
        prev = event_hash(b[i])
    found = feed(a + b)
    assert kinds(found) == [] and found.report.shared_delivery_keys == {"dk-r1": ["r1", "r2"]}


def test_checkpoint_artifacts_are_verified(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path)
    events = run("r1", store=store)
    ref = events[2].artifact_refs[0]
    store.path_for(ref.sha256).write_bytes(b"changed")
    a = feed(events, store=store)
    assert kinds(a) == [("r1", "checkpoint_artifact", 3)]
    assert "checkpoint r1:3" in a.report.findings[0].detail


def test_an_erased_runs_swept_artifact_is_no_finding_and_a_changed_one_still_is(tmp_path: Path) -> None:
    """``runlog erase`` deletes the subject's stored artifacts; the audit reported each one of them as
    a missing checkpoint artifact of the erased run."""
    store = LocalArtifactStore(tmp_path)
    events = run("gone", store=store)
    store.path_for(events[2].artifact_refs[0].sha256).unlink()  # swept by the erase
    assert kinds(feed(events, store=store, erased=frozenset({"gone"}))) == []
    missing = feed(events, store=store)  # not erased: a missing artifact is a finding
    assert kinds(missing) == [("gone", "checkpoint_artifact", 3)]
    assert "ArtifactMissing" in missing.report.findings[0].detail
    store.path_for(events[2].artifact_refs[0].sha256).parent.mkdir(parents=True, exist_ok=True)
    store.path_for(events[2].artifact_refs[0].sha256).write_bytes(b"changed")
    changed = feed(events, store=store, erased=frozenset({"gone"}))
    assert kinds(changed) == [("gone", "checkpoint_artifact", 3)]  # erased, but changed: still a finding


def test_undecodable_records_and_run_filter() -> None:
    a = Auditor("events", AuditOptions(run_id="r1"))
    for off, ev in enumerate(run("r1") + run("r2")):
        a.feed(0, off, ev.run_id.encode(), CODEC.encode(ev))
    a.feed(0, 99, b"r1", b"not avro")
    a.finish(None)
    assert set(a.report.runs) == {"r1"}
    assert [(f.kind, f.offset) for f in a.report.findings] == [("undecodable", 99)]


def test_a_range_that_starts_mid_run_folds_from_its_first_event() -> None:
    events = run("r1")
    a = feed(events[4:], AuditOptions(from_offset=4))
    assert kinds(a) == [] and a.report.runs["r1"].partial
    assert a.report.runs["r1"].state is not None and a.report.runs["r1"].state.last_seq == len(events)


def test_html_is_static_and_shows_stages_and_findings() -> None:
    events = run("r1")
    events[3] = dataclasses.replace(events[3], occurred_at=1)
    page = render_html(feed(events).report.to_dict())
    assert "<script" not in page and "http" not in page.split("<body>")[0]
    assert page.index('data-stage="a"') < page.index('data-stage="b"')
    assert 'class="finding kind-hash_chain"' in page
    assert 'class="event type-STAGE_STARTED other flagged"' in page


def test_sealed_error_messages_and_reasons_read_sealed_in_the_report_and_its_page() -> None:
    from runlog.schemas import ErrorInfo

    sealed = "rlenc1:" + "QUJD" * 20
    events = run("r1", complete=False)
    last = events[-1]
    extra = [RunEvent("r1", last.seq + 1, 1, occurred_at=200, prev_hash=event_hash(last),
                      type=EventType.RUN_CANCELLED, error=ErrorInfo("Cancelled", sealed),
                      attributes={"by": "ops", "reason": sealed})]
    report = feed(events + extra).report.to_dict()
    text = str(report) + render_html(report)
    assert "rlenc1:" not in text and "QUJDQUJD" not in text
    assert "Cancelled: [sealed]" in text and "by ops ([sealed])" in text
