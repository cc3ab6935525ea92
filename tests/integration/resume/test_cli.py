"""``runlog resume --dry-run``, ``runlog show`` and ``runlog demo --json`` as real CLI processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from runlog.processors.demo.run import worker_env
from runlog.projections import dump_namespace
from runlog.projections.log_reader import LogReader
from runlog.schemas import Settings
from tests.integration.resume.conftest import DemoWorld, crash_run

pytestmark = pytest.mark.integration

FIGURES = {"publishes", "renders_billed", "research_calls", "uploads"}
DEMO_APP = "runlog.processors.demo.pipeline:app"


def _runlog(settings: Settings, *args: str, cwd: Path,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runlog", *args], env=worker_env(settings, ""),
                          cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)


def _high_watermarks(settings: Settings) -> dict[int, int]:
    with LogReader(settings, name="t-watermarks") as r:
        return {p: hi for p, (_, hi) in r.watermarks().items()}


def test_resume_dry_run_prints_the_plan_and_changes_nothing_and_show_draws_the_timeline(
        topics: Settings, world: DemoWorld, tmp_path: Path, redis_client: redis.Redis) -> None:
    topics = topics.with_(artifact_inline_bytes=0)  # every payload a file: the plan has artifacts to check
    run_id = crash_run(topics, world, "inside:STAGE:draft", tmp_path)
    marks, keys = _high_watermarks(topics), dump_namespace(redis_client, topics.redis_prefix)

    r = _runlog(topics, "resume", run_id, "--dry-run", "--json", "--app", DEMO_APP, cwd=tmp_path)

    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["run_id"] == run_id and plan["status"] == "RUNNING"
    assert plan["writer_lease_ms"] == 0  # its worker is dead: the lease is gone
    assert plan["checkpoint"]["stage"] == "verify" and plan["checkpoint"]["next_stage"] == "draft"
    assert plan["from_stage"] == "draft"
    assert plan["blocked_reason"] is None and plan["checkpoints_rejected"] == []
    assert plan["events_read"] > 0 and plan["artifacts_checked"] > 0
    # nothing changed: no event appended, no lease taken, no Redis key written
    assert _high_watermarks(topics) == marks
    assert not redis_client.exists(f"{topics.redis_prefix}:{{{run_id}}}:lease")
    assert dump_namespace(redis_client, topics.redis_prefix) == keys

    human = _runlog(topics, "resume", run_id, "--dry-run", "--app", DEMO_APP, cwd=tmp_path)
    assert human.returncode == 0, human.stderr
    assert "continue from: draft" in human.stdout
    assert f"run {run_id} (RUNNING): read" in human.stdout
    assert "writer: none (its lease is gone): a resume takes the run over" in human.stdout

    shown = _runlog(topics, "show", run_id, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith(f"run {run_id}  content@1  RUNNING")
    assert any("RUN_STARTED" in ln for ln in lines)
    assert [ln.split()[0] for ln in lines if ln.startswith("checkpoint ")] == ["checkpoint", "checkpoint"]
    assert any("VERIFIED" in ln and "research" in ln and "sources.count >= 3" in ln for ln in lines)
    assert any("STAGE_STARTED" in ln and "draft" in ln for ln in lines)
    assert _runlog(topics, "show", "run-nobody", cwd=tmp_path).returncode == 1


def test_demo_json_prints_the_receipt_with_the_reference(topics: Settings, tmp_path: Path) -> None:
    r = _runlog(topics, "demo", "--json", cwd=tmp_path, timeout=300)

    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert {"completed", "crashed_at", "reference", *FIGURES} <= set(doc)
    assert set(doc["reference"]) >= FIGURES
    assert doc["completed"] is True
    assert doc["crashed_at"] == "before:EFFECT_RESULT:visual/upload/5"
    assert doc["publishes"] == doc["reference"]["publishes"] == 1
    assert doc["renders_billed"] == doc["reference"]["renders_billed"]
    assert doc["research_calls"] == doc["reference"]["research_calls"] == 1
    assert doc["final_artifacts"] == doc["reference"]["final_artifacts"]
