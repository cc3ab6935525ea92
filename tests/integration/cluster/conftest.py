"""The Redis Cluster the tests of this directory run on, and the fixtures that point them at it.

The cluster comes from ``RUNLOG_TEST_REDIS_CLUSTER_URL`` when set, else ``deploy/local/redis-cluster up``
(idempotent: a cluster already up is reused, and left up; one this session started is stopped at its
end). The tests skip, saying why, only when it cannot start.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.cluster

from runlog.schemas import Settings
from runlog.schemas._redis import redis_client
from tests.conftest import require

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def cluster_url() -> Iterator[str]:
    env = os.environ.get("RUNLOG_TEST_REDIS_CLUSTER_URL")
    if env:
        yield env
        return
    require(shutil.which("redis-server") and shutil.which("redis-cli"),
            "redis-server / redis-cli are not installed: deploy/local/redis-cluster cannot start a cluster")
    script = str(ROOT / "deploy" / "local" / "redis-cluster")
    status = subprocess.run([script, "status"], capture_output=True, text=True, timeout=60, check=False)
    was_running = " pid " in status.stdout
    proc = subprocess.run([script, "up"], capture_output=True, text=True, timeout=600, check=False)
    require(proc.returncode == 0,
            f"deploy/local/redis-cluster up failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    url = next((shlex.split(line[len("export "):])[0].split("=", 1)[1] for line in proc.stdout.splitlines()
                if line.startswith("export REDIS_URL=")), None)
    require(url is not None, f"deploy/local/redis-cluster up printed no REDIS_URL:\n{proc.stdout}")
    assert url is not None
    yield url
    if not was_running:  # leave no processes behind (another checkout's tests need the same ports)
        subprocess.run([script, "down"], capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def settings(settings: Settings, cluster_url: str) -> Iterator[Settings]:
    """The test's settings (own prefixes, Kafka from the session) on the Redis Cluster."""
    s = settings.with_(redis_url=cluster_url)
    yield s
    c = redis_client(s)
    try:
        for k in list(c.scan_iter(match=f"{s.redis_prefix}:*", count=1000)):
            c.delete(k)
    finally:
        c.close()


@pytest.fixture
def redis_client_(settings: Settings) -> Iterator[Any]:
    c = redis_client(settings)
    assert isinstance(c, redis.cluster.RedisCluster)
    yield c
    c.close()
