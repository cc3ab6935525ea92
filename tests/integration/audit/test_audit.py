"""``runlog audit`` over a topic of clean, crashed-and-resumed, still-running runs and a zombie writer."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka import Producer

from runlog.processors.admin import ensure_topics
from runlog.processors.audit import AuditOptions, audit, read_records, write_report
from runlog.processors.cli import main
from runlog.processors.inspect import run_history
from runlog.producers import LocalArtifactStore
from runlog.schemas import ArtifactRef, Codec, EventType, RunEvent, Topics
from tests.conftest import _cleanup
from tests.integration.audit.conftest import AuditWorld

pytestmark = pytest.mark.integration


def test_audit_reports_exactly_the_rejected_events(audit_world: AuditWorld, tmp_path: Path) -> None:
    w = audit_world
    report = audit(w.settings, progress=None)
    print(json.dumps(report.summary(), indent=1))
    assert set(report.runs) == {w.reference_run, w.crashed_run, *w.clean_runs, w.running_run}
    assert [(f.run_id, f.kind, f.seq) for f in report.findings] == [
        (w.crashed_run, "rejected_event", seq) for seq in w.zombie_seqs]
    assert report.rejected_events == 2
    assert all("stale_epoch" in f.detail for f in report.findings)
    jp, hp = write_report(report, tmp_path / "out")
    # owner-only (issue 38): the report quotes payload references and errors
    assert [p.stat().st_mode & 0o777 for p in (tmp_path / "out", jp, hp)] == [0o700, 0o600, 0o600]
    jp.chmod(0o644)
    write_report(report, tmp_path / "out")  # written again: back to 0600
    assert jp.stat().st_mode & 0o777 == 0o600


def test_open_intent_of_a_running_run_is_listed_not_a_finding(audit_world: AuditWorld) -> None:
    report = audit(audit_world.settings, AuditOptions(run_id=audit_world.running_run), progress=None)
    run = report.runs[audit_world.running_run]
    assert run.status == "RUNNING"
    assert [i["delivery_key"] for i in run.open_intents] == ["ab" * 32]
    assert report.findings == []


def test_tampered_and_missing_artifacts_are_reported_by_checkpoint(audit_world: AuditWorld,
                                                                   tmp_path: Path) -> None:
    w = audit_world
    store = LocalArtifactStore(w.settings.artifact_root)
    targets = {}
    for run_id in w.clean_runs:
        ev = next(h.event for h in run_history(w.settings, run_id)
                  if h.event.type is EventType.VERIFIED and h.event.stage == "compose")
        assert ev.payload_ref is not None
        targets[run_id] = (ev.seq, store.path_for(ev.payload_ref.sha256))
    tampered_run, missing_run = w.clean_runs
    saved = {r: path.read_bytes() for r, (_, path) in targets.items()}
    try:
        targets[tampered_run][1].write_bytes(b'{"text":"hello mallory"}')
        targets[missing_run][1].unlink()
        report = audit(w.settings, progress=None)
    finally:
        for r, (_, path) in targets.items():
            path.write_bytes(saved[r])
    found = [(f.run_id, f.seq) for f in report.findings if f.kind == "checkpoint_artifact"]
    assert sorted(found) == sorted([(tampered_run, targets[tampered_run][0]),
                                    (missing_run, targets[missing_run][0])])
    by_run = {f.run_id: f.detail for f in report.findings if f.kind == "checkpoint_artifact"}
    assert f"checkpoint {tampered_run}:{targets[tampered_run][0]}" in by_run[tampered_run]
    assert "ArtifactCorrupt" in by_run[tampered_run]
    assert "ArtifactMissing" in by_run[missing_run]
    assert {f.kind for f in report.findings} == {"checkpoint_artifact", "rejected_event"}
    restored = audit(w.settings, progress=None)
    assert {f.kind for f in restored.findings} == {"rejected_event"}


def test_rewritten_event_in_a_copy_of_the_topic_breaks_the_chain_at_its_seq(
        audit_world: AuditWorld) -> None:
    w = audit_world
    tag = uuid.uuid4().hex[:8]
    copy = w.settings.with_(topic_prefix=f"{w.settings.topic_prefix}copy{tag}.",
                            redis_prefix=f"{w.settings.redis_prefix}copy{tag}")
    try:
        ensure_topics(copy)
        history = run_history(w.settings, w.reference_run)
        victim = next(h.event for h in history if h.event.type is EventType.TOOL_RESULT
                      and 3 < h.event.seq < history[-1].event.seq - 3)
        forged = replace(victim, payload_ref=ArtifactRef("file:///forged", "0" * 64, 1))
        codec = Codec()
        p = Producer(copy.producer_config())
        src, dst = Topics.of(w.settings).events, Topics.of(copy).events
        n = 0
        for part, _off, key, value in read_records(w.settings):
            assert value is not None
            ev = codec.decode(value, RunEvent)
            if ev.run_id == victim.run_id and ev.seq == victim.seq and ev.epoch == victim.epoch:
                value = codec.encode(forged)
            p.produce(dst, key=key, value=value, partition=part)
            n += 1
        assert p.flush(30) == 0 and n > 0 and src != dst
        report = audit(copy, progress=None)
        chain = [(f.run_id, f.kind, f.seq) for f in report.findings if f.kind != "rejected_event"]
        assert chain == [(w.reference_run, "hash_chain", victim.seq)]
        assert f"chain broken at seq {victim.seq}" in next(
            f.detail for f in report.findings if f.kind == "hash_chain")
        assert len([f for f in report.findings if f.kind == "rejected_event"]) == len(w.zombie_seqs)
    finally:
        _cleanup(copy)


def test_offset_and_time_ranges(audit_world: AuditWorld) -> None:
    w = audit_world
    history = run_history(w.settings, w.reference_run)
    mid = history[len(history) // 2]
    report_partition = audit(w.settings, AuditOptions(run_id=w.reference_run), progress=None)
    assert report_partition.findings == [] and report_partition.runs[w.reference_run].state is not None
    p = report_partition.runs[w.reference_run].partition
    ranged = audit(w.settings, AuditOptions(run_id=w.reference_run, from_offset=mid.offset,
                                            to_offset=history[-1].offset + 1), progress=None)
    run = ranged.runs[w.reference_run]
    assert run.partial and run.partition == p
    assert [e["seq"] for e in run.events] == [h.event.seq for h in history if h.offset >= mid.offset]
    assert ranged.findings == []  # the chain is checked from the first event in the range on
    assert run.status == "COMPLETED"

    first_clean = run_history(w.settings, w.clean_runs[0])[0].event.occurred_at
    before = audit(w.settings, AuditOptions(until_ms=first_clean - 1), progress=None)
    assert set(before.runs) == {w.reference_run, w.crashed_run}
    assert before.findings == []  # the zombie wrote after the clean runs
    after = audit(w.settings, AuditOptions(since_ms=first_clean), progress=None)
    assert set(w.clean_runs) | {w.running_run} <= set(after.runs)
    assert w.reference_run not in after.runs


def test_cli_json_summary_exit_status_and_reports(audit_world: AuditWorld, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    s = audit_world.settings
    for k, v in {"KAFKA_BOOTSTRAP_SERVERS": s.kafka_bootstrap_servers, "REDIS_URL": s.redis_url,
                 "RUNLOG_TOPIC_PREFIX": s.topic_prefix, "RUNLOG_REDIS_PREFIX": s.redis_prefix,
                 "RUNLOG_ARTIFACT_ROOT": s.artifact_root}.items():
        monkeypatch.setenv(k, v)
    out = tmp_path / "reports"
    assert main(["audit", "--json", "--out", str(out)]) == 1
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert {"runs", "events", "rejected_events", "findings"} <= set(summary)
    assert summary["runs"] == 5 and summary["rejected_events"] == 2
    assert [f["kind"] for f in summary["findings"]] == ["rejected_event", "rejected_event"]
    assert all(set(f) >= {"run_id", "kind", "detail"} for f in summary["findings"])
    assert "audit:" in captured.err and "records/s" in captured.err  # the progress bar, on stderr
    doc = json.loads((out / "audit.json").read_text())
    assert doc["events"] == summary["events"] and len(doc["runs"]) == 5
    assert (out / "audit.html").read_text().startswith("<!DOCTYPE html>")
    assert main(["audit", "--json", "--run", audit_world.clean_runs[0], "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["findings"] == []
    # a run the topic does not hold is not "0 runs, no findings"
    assert main(["audit", "--run", "run-nope", "--out", str(out)]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.strip().splitlines()[-1].startswith(
        "runlog audit: no events of run 'run-nope'"), captured.err
    # an empty or negative offset range is bad usage, refused before anything is read
    for bad in (["--from-offset", "10", "--to-offset", "5"], ["--from-offset", "3", "--to-offset", "3"],
                ["--from-offset", "-1"]):
        assert main(["audit", *bad, "--out", str(out)]) == 2, bad
        captured = capsys.readouterr()
        assert captured.out == "" and len(captured.err.strip().splitlines()) == 1, captured.err
