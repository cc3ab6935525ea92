"""``runlog show RUN --at SEQ|TIME``: the state as of a point equals the fold of the log up to it."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from runlog.processors.audit import AuditOptions, read_records
from runlog.processors.cli import main
from runlog.projections import RunState, fold
from runlog.schemas import Codec, RunEvent
from tests.integration.audit.conftest import AuditWorld

pytestmark = pytest.mark.integration


def logged(w: AuditWorld, run_id: str) -> list[tuple[int, int, RunEvent]]:
    codec = Codec()
    return [(p, off, codec.decode(v or b"", RunEvent))
            for p, off, _k, v in read_records(w.settings, AuditOptions(run_id=run_id))
            if _k == run_id.encode()]


def show(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], w: AuditWorld,
         *args: str) -> dict[str, object]:
    s = w.settings
    for k, v in {"KAFKA_BOOTSTRAP_SERVERS": s.kafka_bootstrap_servers, "REDIS_URL": s.redis_url,
                 "RUNLOG_TOPIC_PREFIX": s.topic_prefix, "RUNLOG_REDIS_PREFIX": s.redis_prefix}.items():
        monkeypatch.setenv(k, v)
    capsys.readouterr()
    assert main(["show", *args, "--json"]) == 0
    doc: dict[str, object] = json.loads(capsys.readouterr().out)
    return doc


def test_show_at_seq_equals_the_fold_of_the_first_seq_events(
        audit_world: AuditWorld, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    w = audit_world
    events = logged(w, w.crashed_run)
    last = max(e.seq for _, _, e in events)
    for at in (1, 9, last // 2 + 3, last):
        state: RunState | None = None
        for p, off, ev in events:
            state, out = fold(state, ev, (p, off))
            if out.accepted and ev.seq == at:
                break
        assert state is not None and state.last_seq == at
        doc = show(monkeypatch, capsys, w, w.crashed_run, "--at", str(at))
        assert doc["state"] == json.loads(state.to_json()), at
        assert max(e["seq"] for e in doc["events"] if e["outcome"] == "accepted") == at  # type: ignore[attr-defined]


def test_show_at_time_equals_the_fold_of_the_events_until_then(
        audit_world: AuditWorld, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    w = audit_world
    events = logged(w, w.reference_run)
    cut = events[len(events) // 2][2].occurred_at
    state: RunState | None = None
    for p, off, ev in events:
        if ev.occurred_at > cut:
            break
        state, _ = fold(state, ev, (p, off))
    assert state is not None and 1 < state.last_seq < events[-1][2].seq
    iso = datetime.fromtimestamp(cut / 1000, tz=UTC).isoformat(timespec="milliseconds")
    doc = show(monkeypatch, capsys, w, w.reference_run, "--at", iso)
    assert doc["state"] == json.loads(state.to_json())
