"""The tests' own namespaces: what ``tests/conftest.py`` hands out, it removes, and it checks.

Every test's topic prefix and Redis prefix are recorded when a fixture hands them out, removed when
that fixture is torn down (topics, every key under the Redis prefix including the namespaces beside
it, the projector's data directories), and counted again when the session ends: a namespace that
still holds something fails the session. These tests check each half, and that a session which
leaks does fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis

from runlog.schemas import Settings, Topics
from tests.conftest import _HANDED_OUT, ROOT, Services, _cleanup, _namespace, claim, leftovers

pytestmark = pytest.mark.integration


@pytest.fixture
def beside(settings: Settings) -> Settings:
    """A fixture built on ``settings`` with longer prefixes, as a test's own fixture would be."""
    return settings.with_(topic_prefix=f"{settings.topic_prefix}beside.",
                          redis_prefix=f"{settings.redis_prefix}.beside")


@pytest.fixture
def foreign(services: Services) -> Settings:
    """Settings outside every namespace the session handed out (another process's, say)."""
    return Settings.from_env({}, kafka_bootstrap_servers=services.kafka_bootstrap_servers,
                             redis_url=services.redis_url, topic_prefix="elsewhere.",
                             redis_prefix="elsewhere")


def test_what_a_namespace_holds_is_counted_then_removed(topics: Settings, redis_client: redis.Redis) -> None:
    p = topics.redis_prefix
    planted = sorted([f"{p}:{{run-1}}:epoch", f"{p}:runs:active", f"{p}.rebuild:{{run-1}}:state",
                      f"{p}.ref:effects:by_key", f"{p}:rebuilt:{{run-2}}:state"])
    for k in planted:
        redis_client.set(k, b"1")
    other = f"t{uuid.uuid4().hex[:10]}"  # another test's prefix, same length
    redis_client.set(f"{other}:{{run-1}}:epoch", b"1")
    data = ROOT / f"{topics.topic_prefix}proj-data"
    data.mkdir()
    try:
        assert _namespace(topics) in _HANDED_OUT
        (left,) = leftovers([topics], wait_s=0)
        assert left.keys == planted  # the other prefix's key is not counted
        assert Topics.of(topics).events in left.topics and len(left.topics) >= 4
        assert all(t.startswith(topics.topic_prefix) for t in left.topics)
        assert left.dirs == [str(data)]
        _cleanup(topics)
        assert leftovers([topics]) == []
        assert redis_client.exists(f"{other}:{{run-1}}:epoch") == 1
    finally:
        redis_client.delete(f"{other}:{{run-1}}:epoch")


def test_a_fixture_built_on_a_namespace_is_claimed_and_one_outside_is_not(beside: Settings,
                                                                          foreign: Settings) -> None:
    assert _namespace(beside) in _HANDED_OUT
    assert _namespace(foreign) not in _HANDED_OUT  # never cleaned: it is not the tests' data


LEAKY = '''
import os
from pathlib import Path

import tests.conftest as shared


def test_leaks(settings, redis_client):
    shared._cleanup = lambda s: None  # the teardown forgets to remove the namespace
    Path(os.environ["LEAK_PREFIX_FILE"]).write_text(settings.redis_prefix)
    redis_client.set(f"{settings.redis_prefix}.rebuild:{{run-1}}:state", b"1")
'''


def test_a_session_that_leaves_keys_behind_fails(settings: Settings, tmp_path: Path) -> None:
    (tmp_path / "test_leaky.py").write_text(LEAKY)
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap_servers,
           "REDIS_URL": settings.redis_url, "LEAK_PREFIX_FILE": str(tmp_path / "prefix")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
                           "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), "-q",
                           str(tmp_path / "test_leaky.py")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    prefix = (tmp_path / "prefix").read_text() if (tmp_path / "prefix").exists() else None
    try:
        out = proc.stdout + proc.stderr
        assert prefix is not None, out
        assert proc.returncode == 1, out
        assert "1 passed, 1 error" in out, out
        assert "1 of the 1 namespaces this session handed out were not removed at teardown" in out, out
        assert f"{prefix}.rebuild:{{run-1}}:state" in out, out
    finally:
        if prefix is not None:
            _cleanup(claim(settings.with_(topic_prefix=f"{prefix}.", redis_prefix=prefix)))
