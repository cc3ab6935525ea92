"""The audit's HTML report in headless Chromium: each run's stages in order, findings highlighted."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from runlog.processors.audit import audit, write_report
from tests.conftest import require
from tests.integration.audit.conftest import AuditWorld

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# The page is static (no scripts), so what Chromium lays out is exactly the markup written.


def chromium() -> str:
    found = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    require(found is not None, "chromium is not installed and could not be installed (deploy/env.sh "
            "tries apt-get)")
    assert found is not None
    return found


def run_chromium(binary: str, *args: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="runlog-chromium-") as profile:
        return subprocess.run([binary, *FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=120, check=False)


class Timeline(HTMLParser):
    """Per run (``section.run``): its stage blocks and findings, in document order."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: dict[str, dict[str, Any]] = {}
        self._run: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if tag == "section" and "run" in classes:
            self._run = a["data-run"] or ""
            self.runs[self._run] = {"stages": [], "findings": [], "highlighted": "has-findings" in classes}
        elif self._run is not None and tag == "li" and "stage" in classes:
            self.runs[self._run]["stages"].append((a["data-stage"], a["data-outcome"]))
        elif self._run is not None and tag == "li" and "finding" in classes:
            self.runs[self._run]["findings"].append(a["data-kind"])


def test_html_report_renders_in_chromium_with_each_runs_stages_in_order(audit_world: AuditWorld,
                                                                        tmp_path: Path) -> None:
    binary = chromium()
    report = audit(audit_world.settings, progress=None)
    _, page = write_report(report, tmp_path / "audit")
    dom = run_chromium(binary, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    parsed = Timeline()
    parsed.feed(dom.stdout)
    assert set(parsed.runs) == set(report.runs)
    for run_id, run in report.runs.items():
        assert run.state is not None and run.state.workflow is not None
        seen = parsed.runs[run_id]
        verified = [s for s, outcome in seen["stages"] if outcome == "verified"]
        if run.status == "COMPLETED":
            assert verified == list(run.state.workflow.stage_names), (run_id, seen["stages"])
        assert [s for s, _ in seen["stages"]] == [b["stage"] for b in run.stages()]
    crashed = parsed.runs[audit_world.crashed_run]
    assert ("visual", "interrupted") in crashed["stages"]  # the worker died while uploading the cover
    assert crashed["highlighted"] and crashed["findings"] == ["rejected_event", "rejected_event"]
    assert not parsed.runs[audit_world.reference_run]["highlighted"]

    shots = ROOT / ".runlog" / "reports"
    shots.mkdir(parents=True, exist_ok=True)
    shot = shots / "audit-report.png"
    shot.unlink(missing_ok=True)
    res = run_chromium(binary, f"--screenshot={shot}", "--window-size=1280,2400", page.as_uri())
    assert res.returncode == 0, res.stderr[-2000:]
    assert shot.stat().st_size > 10_000
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
