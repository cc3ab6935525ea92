"""Test fixtures: a real Kafka broker and a real Redis for the whole session.

Where they come from, in order:

1. ``KAFKA_BOOTSTRAP_SERVERS`` and ``REDIS_URL`` when both are set;
2. testcontainers, when a Docker engine answers;
3. the local services ``deploy/local/up`` starts (real Apache Kafka in KRaft mode
   from Maven jars, Debian's redis-server).

Every test that asks for ``settings`` gets its own topic prefix and Redis key
prefix, so tests never see each other's data.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from schemas._redis import redis_client as _redis_client
from schemas.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Services:
    kafka_bootstrap_servers: str
    redis_url: str
    source: str


def _docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        r = subprocess.run(["docker", "info"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def _from_local_up() -> Services:
    proc = subprocess.run(
        [str(ROOT / "deploy" / "local" / "up")],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env={k: v for k, v in os.environ.items()
             if k not in ("KAFKA_BOOTSTRAP_SERVERS", "REDIS_URL")},
    )
    if proc.returncode != 0:
        pytest.exit(f"deploy/local/up failed ({proc.returncode}):\n{proc.stderr[-4000:]}", 3)
    found: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("export ") and "=" in line:
            k, v = line[len("export "):].split("=", 1)
            found[k] = v.strip().strip("'\"")
    return Services(found["KAFKA_BOOTSTRAP_SERVERS"], found["REDIS_URL"], "deploy/local")


@pytest.fixture(scope="session")
def services() -> Iterator[Services]:
    """Kafka and Redis addresses for the session (see the module docstring)."""
    env_kafka = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    env_redis = os.environ.get("REDIS_URL")
    if env_kafka and env_redis:
        yield Services(env_kafka, env_redis, "environment")
        return
    if _docker_answers():  # pragma: no cover - no Docker engine on the CI machine
        from testcontainers.kafka import KafkaContainer
        from testcontainers.redis import RedisContainer

        with KafkaContainer("apache/kafka:4.1.1").with_kraft() as kafka, \
                RedisContainer("redis:7") as red:
            url = f"redis://{red.get_container_host_ip()}:{red.get_exposed_port(6379)}/0"
            yield Services(kafka.get_bootstrap_server(), url, "testcontainers")
        return
    yield _from_local_up()


@pytest.fixture
def test_id() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture
def settings(services: Services, test_id: str, tmp_path: Path) -> Iterator[Settings]:
    """Settings private to one test: its own topic prefix, Redis prefix and artifact root."""
    s = Settings.from_env(
        {},
        kafka_bootstrap_servers=services.kafka_bootstrap_servers,
        redis_url=services.redis_url,
        topic_prefix=f"t{test_id}.",
        redis_prefix=f"t{test_id}",
        partitions=12,
        artifact_root=str(tmp_path / "artifacts"),
        lease_ttl_ms=3000,
        metrics_port=0,
    )
    yield s
    _cleanup(s)


def _cleanup(s: Settings) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(s.admin_config())
    md = admin.list_topics(timeout=10)
    mine = [t for t in md.topics if t.startswith(s.topic_prefix)]
    if mine:
        admin.delete_topics(mine, operation_timeout=10)
    r = _redis_client(s)  # a RedisCluster for a redis+cluster:// URL
    try:
        keys = list(r.scan_iter(match=f"{s.redis_prefix}:*", count=1000))
        for i in range(0, len(keys), 500):
            r.delete(*keys[i:i + 500])
    finally:
        r.close()


@pytest.fixture
def topics(settings: Settings) -> Settings:
    """``settings`` with Runlog's topics created on the broker."""
    from processors.admin import ensure_topics

    reports = ensure_topics(settings)
    assert all(r.action == "created" for r in reports), reports
    return settings


@pytest.fixture
def redis_client(settings: Settings) -> Iterator[redis.Redis]:
    client: redis.Redis = _redis_client(settings)
    yield client
    client.close()
