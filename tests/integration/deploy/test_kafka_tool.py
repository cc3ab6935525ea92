"""``deploy/local/kafka-tool``: the broker's own tools (topics, offsets, consumer groups, configs) from the
jars deploy/ fetches, pointed at the configured broker."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from runlog.producers import Runner
from runlog.schemas import Settings, Topics
from tests.conftest import require
from tests.integration.producers.conftest import SOURCE
from tests.integration.producers.test_write_path import content_workflow

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]
TOOL = ROOT / "deploy" / "local" / "kafka-tool"


def _tool(settings: Settings, *args: str) -> str:
    require(shutil.which("java") is not None or Path("/usr/lib/jvm").exists(),
            "no Java on this machine: deploy/local/kafka-tool needs it (deploy/local/up installs it)")
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap_servers}
    proc = subprocess.run([str(TOOL), *args], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_topics_offsets_and_configs_of_the_events_topic(topics: Settings) -> None:
    events = Topics.of(topics).events
    with Runner.from_settings(topics, source=SOURCE) as r:
        result = r.run(content_workflow(), {"topic": "kafka"}, inputs={"facts": "v1"})
    described = _tool(topics, "topics", "--describe", "--topic", events)
    assert f"PartitionCount: {topics.partitions}" in described
    offsets = {}
    for line in _tool(topics, "get-offsets", "--topic", events).split():
        name, part, end = line.rsplit(":", 2)
        assert name == events
        offsets[int(part)] = int(end)
    assert sorted(offsets) == list(range(topics.partitions))
    assert sum(offsets.values()) == result.last_seq  # the one run's events, every one counted
    configs = _tool(topics, "configs", "--entity-type", "topics", "--entity-name", events, "--describe")
    assert "retention.ms=-1" in configs


def test_an_unknown_tool_is_refused_with_a_hint() -> None:
    proc = subprocess.run([str(TOOL), "no-such-tool"], capture_output=True, text=True, timeout=30,
                          check=False)
    assert proc.returncode == 1 and "unknown tool: no-such-tool" in proc.stderr
