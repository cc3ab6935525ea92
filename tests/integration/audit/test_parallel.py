"""``--workers N``: an audit and a rebuild split by partition across processes give what one process gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from runlog.processors.audit import AuditOptions, AuditReport, audit
from runlog.processors.cli import main
from runlog.projections.rebuild import dump_namespace, rebuild
from tests.integration.audit.conftest import AuditWorld

pytestmark = pytest.mark.integration


def _doc(report: object) -> dict[str, object]:
    d = report.to_dict()  # type: ignore[attr-defined]
    d.pop("seconds")
    return d  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def one_audit(audit_world: AuditWorld) -> AuditReport:
    return audit(audit_world.settings, AuditOptions(check_artifacts=False), progress=None)


def test_an_audit_in_two_workers_reports_what_one_reports(audit_world: AuditWorld,
                                                          one_audit: AuditReport) -> None:
    w = audit_world
    opts = AuditOptions(check_artifacts=False)
    one = one_audit
    two = audit(w.settings, opts, progress=None, workers=2)
    assert len({r.partition for r in one.runs.values()}) >= 2  # the split has something to split
    assert one.findings and one.anchors_checked
    assert _doc(two) == _doc(one)


def test_a_rebuild_in_two_workers_writes_what_one_writes(audit_world: AuditWorld,
                                                          redis_client: redis.Redis) -> None:
    s = audit_world.settings
    a, b = f"{s.redis_prefix}.par1", f"{s.redis_prefix}.par2"
    try:
        one = rebuild(s, a, progress=None, client=redis_client)
        two = rebuild(s, b, progress=None, client=redis_client, workers=2)
        counts = (one.records, one.applied, one.rejected)
        assert (two.records, two.applied, two.rejected) == counts and one.applied > 0
        assert two.high_watermarks == one.high_watermarks
        got, want = dump_namespace(redis_client, b), dump_namespace(redis_client, a)
        assert got == want and want
    finally:
        for p in (a, b):
            for k in redis_client.scan_iter(match=f"{p}:*", count=1000):
                redis_client.delete(k)


def test_the_cli_audits_with_workers_and_shows_progress(audit_world: AuditWorld, one_audit: AuditReport,
                                                        tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    w = audit_world
    s = w.settings
    for k, v in {"KAFKA_BOOTSTRAP_SERVERS": s.kafka_bootstrap_servers, "REDIS_URL": s.redis_url,
                 "RUNLOG_TOPIC_PREFIX": s.topic_prefix, "RUNLOG_REDIS_PREFIX": s.redis_prefix,
                 "RUNLOG_ARTIFACT_ROOT": s.artifact_root}.items():
        monkeypatch.setenv(k, v)
    code = main(["audit", "--workers", "2", "--no-artifacts", "--json", "--out", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    doc = json.loads(out)
    one = one_audit
    assert code == 1 and doc["events"] == one.events and len(doc["findings"]) == len(one.findings)
    assert "audit (2 workers)" in err
    assert main(["audit", "--workers", "0"]) == 2
