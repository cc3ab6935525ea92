"""Fixtures of the producers' unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.unit.producers._agent_world import World, open_world


@pytest.fixture
def world() -> Iterator[World]:
    """The in-memory world of the agent integrations' tests (a module's own ``world`` wins)."""
    with open_world() as w:
        yield w
