"""Fixtures of the producer integration tests: a Runner on the real broker and Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from runlog.producers import DictInputSource, Runner
from runlog.schemas import Settings

SOURCE = DictInputSource({
    "facts": {"v1": {"claims": ["a", "b"]}, "v2": {"claims": ["a", "b", "c"]}},
    "style": {"house-1": {"tone": "plain"}},
})


@pytest.fixture
def runner(topics: Settings) -> Iterator[Runner]:
    r = Runner.from_settings(topics, source=SOURCE)
    yield r
    r.close()
