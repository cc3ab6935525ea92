"""The anchored chain against the real broker and Redis: the projection of the audit world's log
(built with the projector's batch path) holds each run's last seq and hash; copies of the log with a
cut tail, a lost run or an edited last event are audited against it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import redis
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from runlog.processors.admin import ensure_topics
from runlog.processors.audit import AuditOptions, AuditReport, audit, read_records
from runlog.processors.cli import main
from runlog.processors.inspect import run_history
from runlog.projections import RedisStore
from runlog.projections.rebuild import replay_into
from runlog.schemas import Codec, RunEvent, Settings, Topics
from tests.integration.audit.conftest import AuditWorld

pytestmark = pytest.mark.integration

CODEC = Codec()


def _drop_namespace(r: redis.Redis, prefix: str) -> None:
    keys = list(r.scan_iter(match=f"{prefix}:*", count=1000))
    for i in range(0, len(keys), 500):
        r.delete(*keys[i:i + 500])


@pytest.fixture(scope="module")
def projected(audit_world: AuditWorld) -> Iterator[str]:
    """A Redis namespace holding the projection of the whole audit world's log."""
    s = audit_world.settings
    prefix = f"{s.redis_prefix}:anchors{uuid.uuid4().hex[:6]}"
    r = redis.Redis.from_url(s.redis_url)
    try:
        report = replay_into(s, RedisStore(r, prefix))
        assert report.applied > 0 and report.dead_letters == 0
        yield prefix
    finally:
        _drop_namespace(r, prefix)
        r.close()


@pytest.fixture
def copies(audit_world: AuditWorld) -> Iterator[Callable[..., Settings]]:
    """Copies of the audit world's events topic under fresh topic prefixes (deleted afterwards)."""
    made: list[Settings] = []

    def copy(projection: str, change: Callable[[RunEvent], RunEvent | None]) -> Settings:
        """Every record of the world's topic, through ``change`` (None drops it), into a new topic;
        settings that audit the copy against the projection namespace ``projection``."""
        w = audit_world.settings
        c = w.with_(topic_prefix=f"{w.topic_prefix}anc{uuid.uuid4().hex[:8]}.", redis_prefix=projection)
        made.append(c)
        ensure_topics(c)
        p = Producer(c.producer_config())
        dst = Topics.of(c).events
        for part, _off, key, value in read_records(w, AuditOptions()):
            assert value is not None
            ev = change(CODEC.decode(value, RunEvent))
            if ev is not None:
                p.produce(dst, key=key, value=CODEC.encode(ev), partition=part)
        assert p.flush(30) == 0
        return c

    try:
        yield copy
    finally:  # the copies' topics; the projection namespaces belong to their fixtures
        admin = AdminClient(audit_world.settings.admin_config())
        names = [t for t in admin.list_topics(timeout=10).topics
                 if any(t.startswith(c.topic_prefix) for c in made)]
        if names:
            admin.delete_topics(names, operation_timeout=10)


def anchor_findings(report: AuditReport) -> list[tuple[str, str, int | None]]:
    return [(f.run_id, f.kind, f.seq) for f in report.findings if f.kind != "rejected_event"]


def last_event(w: AuditWorld, run_id: str) -> RunEvent:
    """The run's last event (the clean runs have no rejected events)."""
    return run_history(w.settings, run_id)[-1].event


def test_an_untouched_log_matches_every_anchor(audit_world: AuditWorld, projected: str) -> None:
    w = audit_world
    report = audit(w.settings.with_(redis_prefix=projected), progress=None)
    assert anchor_findings(report) == []
    assert len(report.findings) == report.rejected_events == len(w.zombie_seqs)  # the zombie, as before
    assert report.summary()["anchors"] == {"ok": 5}
    for run in report.runs.values():
        assert run.anchor is not None and run.anchor["checked"] >= 1
        assert run.state is not None and run.anchor["seq"] == run.state.last_seq
        assert run.anchor["hash"] == run.state.last_hash
    # the world's own namespace has no projection (no projector ran): nothing to check, no finding
    plain = audit(w.settings, progress=None)
    assert plain.summary()["anchors"] == {"not_projected": 5} and anchor_findings(plain) == []


def test_a_cut_tail_and_a_lost_run_are_truncated(audit_world: AuditWorld, projected: str,
                                                 copies: Callable[..., Settings], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    w = audit_world
    cut, lost = w.clean_runs[0], w.running_run
    last = last_event(w, cut)
    copy = copies(projected, lambda ev: None if ev.run_id == lost or (ev.run_id == cut and ev.seq == last.seq)
                  else ev)
    report = audit(copy, progress=None)
    assert sorted(anchor_findings(report)) == sorted([(cut, "truncated", last.seq), (lost, "truncated", 1)])
    by_run = {f.run_id: f.detail for f in report.findings if f.kind == "truncated"}
    assert f"the log ends at seq {last.seq - 1}, but the projection accepted seq {last.seq}" in by_run[cut]
    assert "no event of this run is on the log" in by_run[lost]
    assert report.runs[cut].anchor is not None and report.runs[cut].anchor["status"] == "truncated"
    assert report.summary()["anchors"] == {"ok": 3, "truncated": 2}
    # the topic alone cannot see either: the chain of what is left is whole
    for k, v in {"KAFKA_BOOTSTRAP_SERVERS": copy.kafka_bootstrap_servers, "REDIS_URL": copy.redis_url,
                 "RUNLOG_TOPIC_PREFIX": copy.topic_prefix, "RUNLOG_REDIS_PREFIX": copy.redis_prefix,
                 "RUNLOG_ARTIFACT_ROOT": copy.artifact_root}.items():
        monkeypatch.setenv(k, v)
    capsys.readouterr()
    out = str(tmp_path / "reports")
    assert main(["audit", "--json", "--no-anchors", "--no-artifacts", "--out", out]) == 1  # the zombie
    alone = json.loads(capsys.readouterr().out)
    assert {f["kind"] for f in alone["findings"]} == {"rejected_event"} and alone["anchors"] is None
    assert main(["audit", "--no-artifacts", "--out", out]) == 1
    out = capsys.readouterr().out
    assert "truncated" in out and "anchors: 3 ok, 2 truncated" in out


def test_an_edited_last_event_is_an_anchor_mismatch(audit_world: AuditWorld, projected: str,
                                                    copies: Callable[..., Settings]) -> None:
    w = audit_world
    victim = w.clean_runs[1]
    last = last_event(w, victim)

    def edit(ev: RunEvent) -> RunEvent:
        if ev.run_id == victim and ev.seq == last.seq and ev.epoch == last.epoch:
            return replace(ev, occurred_at=ev.occurred_at + 1)  # same seq, same prev_hash: chain intact
        return ev

    copy = copies(projected, edit)
    report = audit(copy, progress=None)
    assert anchor_findings(report) == [(victim, "anchor_mismatch", last.seq)]
    assert "(run state)" in next(f.detail for f in report.findings if f.kind == "anchor_mismatch")
    assert anchor_findings(audit(copy, AuditOptions(anchors=False), progress=None)) == []  # unseen alone


def test_a_projection_from_before_the_anchors_says_no_anchor(audit_world: AuditWorld, projected: str,
                                                             copies: Callable[..., Settings]) -> None:
    """Old runs stay readable: state written without ``last_hash`` (and with five-item checkpoint
    entries) is no anchor, not an error, even for a log whose tail is gone."""
    w = audit_world
    old = f"{projected}old"
    r = redis.Redis.from_url(w.settings.redis_url)
    try:
        for key in list(r.scan_iter(match=f"{projected}:*")):
            name = key.decode()
            dst = old + name[len(projected):]
            r.restore(dst, 0, r.dump(key), replace=True)  # type: ignore[arg-type]
            if name.endswith(":state"):
                snap = json.loads(r.hget(dst, "snapshot"))  # type: ignore[arg-type]
                del snap["last_hash"]
                snap["checkpoints"] = [c[:5] for c in snap["checkpoints"]]
                r.hset(dst, "snapshot", json.dumps(snap))
                r.hdel(dst, "last_hash")
        assert RedisStore(r, old).load_state(w.clean_runs[0]) is not None
        cut = w.clean_runs[0]
        last = last_event(w, cut)
        copy = copies(old, lambda ev: None if ev.run_id == cut and ev.seq == last.seq else ev)
        report = audit(copy, progress=None)
        assert anchor_findings(report) == []
        assert report.summary()["anchors"] == {"no_anchor": 5}
        assert all(run.anchor is not None and run.anchor["status"] == "no_anchor"
                   for run in report.runs.values())
    finally:
        _drop_namespace(r, old)
        r.close()


def test_redis_unreachable_exits_3_and_no_anchors_goes_on(audit_world: AuditWorld, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    s = audit_world.settings
    for k, v in {"KAFKA_BOOTSTRAP_SERVERS": s.kafka_bootstrap_servers, "REDIS_URL": "redis://127.0.0.1:1/0",
                 "RUNLOG_TOPIC_PREFIX": s.topic_prefix, "RUNLOG_REDIS_PREFIX": s.redis_prefix}.items():
        monkeypatch.setenv(k, v)
    out = str(tmp_path / "reports")
    assert main(["audit", "--run", audit_world.clean_runs[0], "--no-artifacts", "--out", out]) == 3
    assert "--no-anchors" in capsys.readouterr().err
    assert main(["audit", "--run", audit_world.clean_runs[0], "--no-artifacts", "--no-anchors",
                 "--out", out]) == 0
