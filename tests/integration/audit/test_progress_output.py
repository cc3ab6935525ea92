"""Progress bars go to stderr, never into what a command prints on stdout (``runlog audit --json``,
``runlog projections rebuild``), as real processes with their output piped (no TTY)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runlog.schemas import Settings
from tests.integration.audit.conftest import AuditWorld
from tests.integration.processors.harness import ROOT, env_of, produce
from tests.unit.projections.runlogs import full_run

pytestmark = pytest.mark.integration

BAR_BITS = ("\r", "%|", "records/s")
"""What a progress bar writes (tqdm), and a report line never holds."""


def _runlog(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as a process; its output decoded as written (text mode would turn ``\r`` into
    newlines)."""
    env = env_of(settings, RUNLOG_ARTIFACT_ROOT=settings.artifact_root)
    r = subprocess.run([sys.executable, "-m", "runlog", *args], cwd=ROOT, env=env,
                       capture_output=True, timeout=180, check=False)
    return subprocess.CompletedProcess(r.args, r.returncode, r.stdout.decode(), r.stderr.decode())


def _no_bar(text: str) -> None:
    leaked = [b for b in BAR_BITS if b in text]
    assert not leaked, f"progress text {leaked} on stdout: {text!r}"


def test_audit_json_prints_one_json_line_and_draws_its_bar_on_stderr(audit_world: AuditWorld,
                                                                      tmp_path: Path) -> None:
    r = _runlog(audit_world.settings, "audit", "--json", "--out", str(tmp_path / "reports"))
    assert r.returncode in (0, 1), r.stderr
    _no_bar(r.stdout)
    lines = r.stdout.splitlines()
    assert len(lines) == 1, r.stdout
    assert json.loads(lines[0])["runs"] == 5
    assert "\raudit:" in r.stderr and "records/s" in r.stderr, r.stderr  # asked for: drawn on stderr


def test_rebuild_prints_its_report_on_stdout_and_its_bar_on_stderr(topics: Settings) -> None:
    n = produce(topics, [e for i in range(3) for e in full_run(f"bar-{i}")])
    r = _runlog(topics, "projections", "rebuild")
    assert r.returncode == 0, r.stderr
    _no_bar(r.stdout)
    assert r.stdout.startswith(f"rebuilt {topics.redis_prefix}:rebuild: {n} records"), r.stdout
    assert "\rrebuild:" in r.stderr and f"{n}/{n}" in r.stderr, r.stderr

    quiet = _runlog(topics, "projections", "rebuild", "--json")
    assert quiet.returncode == 0, quiet.stderr
    _no_bar(quiet.stdout)
    assert json.loads(quiet.stdout)["records"] == n
    assert "rebuild:" not in quiet.stderr, quiet.stderr  # --json draws no bar at all
