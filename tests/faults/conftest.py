"""Fixtures of the fault suite: where the JSON report goes."""

from __future__ import annotations

from pathlib import Path

import pytest

from runlog.schemas import Settings


@pytest.fixture(scope="session")
def fault_report() -> Path:
    """``RUNLOG_FAULT_REPORT`` (default ``.runlog/reports/faults.json``), relative to the repo root."""
    p = Path(Settings.from_env().fault_report)
    return p if p.is_absolute() else Path(__file__).resolve().parents[2] / p
