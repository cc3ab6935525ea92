"""Fixtures of the fleet tests: settings with a resumer group of their own, and the workers a test
starts (each one leaves when the test ends)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from runlog.schemas import Settings
from tests.integration.fleet._members import _Member


@pytest.fixture
def fleet_settings(topics: Settings) -> Settings:
    return topics.with_(resumer_group=f"t-fleet-{uuid.uuid4().hex[:8]}", sweep_interval_ms=1000)


@pytest.fixture
def members(fleet_settings: Settings) -> Iterator[list[_Member]]:
    out: list[_Member] = []
    yield out
    for m in out:
        if m.thread.is_alive() or not m.stop.is_set():
            m.leave()
