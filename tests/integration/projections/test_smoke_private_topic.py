"""``runlog smoke`` leaves no test data in the log: it round-trips through a private topic it deletes.

(Here with the other rebuild/log-hygiene tests; it runs the real CLI against the real broker.)
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
import redis
from confluent_kafka.admin import AdminClient

from runlog.processors.cli.admin import smoke_settings
from runlog.projections.log_reader import LogReader
from runlog.schemas import Settings, Topics
from tests.integration.processors.harness import ROOT, env_of

pytestmark = pytest.mark.integration


def _watermarks(settings: Settings) -> dict[str, dict[int, tuple[int, int]]]:
    """Low and high watermarks of every partition of Runlog's topics (a leader election of a fresh
    topic is waited out)."""
    t = Topics.of(settings)
    out = {}
    for name in (t.events, t.checkpoints, t.effects, t.resume, t.dlq):
        with LogReader(settings, name, name="t-smoke-watermarks", timeout=30) as r:
            out[name] = r.watermarks()
    return out


def test_smoke_writes_no_record_to_the_events_topic_and_deletes_its_own(
    topics: Settings, redis_client: redis.Redis
) -> None:
    before = _watermarks(topics)
    assert all(hi == 0 for parts in before.values() for _, hi in parts.values())
    out = subprocess.run([sys.executable, "-m", "runlog", "smoke", "--runs", "3"], cwd=ROOT,
                         env=env_of(topics), capture_output=True, text=True, timeout=180, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    # Runlog's own topics got nothing: a whole-topic audit sees only real runs
    assert _watermarks(topics) == before
    m = re.search(r"smoke: 6 events appended to (\S+), 6 read back, equal; topic deleted", out.stdout)
    assert m is not None, out.stdout
    private = m.group(1)
    assert private.startswith(f"{topics.topic_prefix}smoke-") and private.endswith(".runlog.events")
    assert private != Topics.of(topics).events
    # the private topic is gone (deletion completes asynchronously on the controller)
    admin = AdminClient(topics.admin_config())
    deadline = time.monotonic() + 30
    while private in admin.list_topics(timeout=10).topics and time.monotonic() < deadline:
        time.sleep(0.5)
    assert private not in admin.list_topics(timeout=10).topics
    assert not [t for t in admin.list_topics(timeout=10).topics if "smoke-" in t and
                t.startswith(topics.topic_prefix)]
    # and Redis was not written
    assert list(redis_client.scan_iter(match=f"{topics.redis_prefix}*")) == []


def test_smoke_settings_are_private_under_the_configured_prefixes(settings: Settings) -> None:
    s = smoke_settings(settings, "abc123")
    assert s.topic_prefix == f"{settings.topic_prefix}smoke-abc123."
    assert s.redis_prefix == f"{settings.redis_prefix}:smoke-abc123"
    assert Topics.of(s).events != Topics.of(settings).events
    assert Topics.of(s).events.startswith(settings.topic_prefix)
