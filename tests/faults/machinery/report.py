"""The fault suite's machine-readable summary (JSON at ``Settings.fault_report``).

Each part of the suite (crash matrix, double crashes, infrastructure faults,
bad input) writes its own section; the totals are recomputed over all sections
on every write, so the file always describes the last run of each part.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["COUNTERS", "PointEntry", "write_section"]

COUNTERS = ("duplicate_effects", "duplicate_renders", "lost_events", "projection_mismatches")


@dataclass
class PointEntry:
    """One fault injected and what came of it."""

    point: str
    outcome: str
    """``completed`` | ``blocked`` | ``no_run`` | ``FAILED`` (a check failed) | a fault's own word."""
    run_id: str | None = None
    completed: bool = False
    checks: dict[str, bool] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    duplicate_effects: int = 0
    duplicate_renders: int = 0
    lost_events: int = 0
    projection_mismatches: int = 0
    seconds: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failures

    def conclude(self, outcome: str, started: float) -> None:
        """Failures = the checks that did not hold; ``outcome`` when none, else ``FAILED``; the time
        since ``started`` (a ``time.monotonic()`` reading)."""
        self.failures = sorted(k for k, v in self.checks.items() if not v)
        self.outcome = outcome if not self.failures else "FAILED"
        self.seconds = round(time.monotonic() - started, 3)


def _totals(sections: Mapping[str, Any]) -> dict[str, Any]:
    entries = [e for s in sections.values() for e in s.get("points", [])]
    out: dict[str, Any] = {
        "points_tried": len(entries),
        "runs_completed": sum(1 for e in entries if e.get("completed")),
        "points_failed": sum(1 for e in entries if e.get("failures")),
    }
    for c in COUNTERS:
        out[c] = sum(int(e.get(c, 0)) for e in entries)
    return out


def write_section(path: str | os.PathLike[str], name: str, entries: Sequence[PointEntry],
                  **extra: Any) -> dict[str, Any]:
    """Replace section ``name`` of the report at ``path`` and recompute the totals; returns the doc.
    Under a lock on ``<path>.lock``: fault modules in parallel pytest-xdist workers each write their
    section, and a read-modify-write without it could drop another's."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p.with_suffix(p.suffix + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _write_section(p, name, entries, **extra)


def _write_section(p: Path, name: str, entries: Sequence[PointEntry], **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    if p.exists():
        try:
            loaded = json.loads(p.read_text())
            doc = loaded if isinstance(loaded, dict) else {}
        except json.JSONDecodeError:
            doc = {}
    sections: dict[str, Any] = dict(doc.get("sections", {}))
    sections[name] = {"written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                      "points": [asdict(e) for e in entries], **extra}
    doc = {**_totals(sections), "sections": sections}
    doc["points"] = [{"section": n, **e} for n, s in sections.items() for e in s["points"]]
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    tmp.replace(p)
    return doc
