"""Production-shaped settings against the real services: quiet client closes, Redis over mutual
TLS from the ``RUNLOG_REDIS_SSL_*`` settings, rebuild under a Redis ACL limited to the key prefix."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from runlog.projections import RedisStore, rebuild
from runlog.projections.redis_store import ProjectionStoreError
from runlog.schemas import Settings, Topics
from tests.conftest import require
from tests.integration.processors.harness import ROOT, env_of, produce
from tests.unit.processors.test_projector_settings import Pki, make_pki
from tests.unit.projections.runlogs import full_run

pytestmark = pytest.mark.integration


def test_clean_client_closes_write_nothing_to_stderr(
    topics: Settings, capfd: pytest.CaptureFixture[str]
) -> None:
    """librdkafka's lines go through Python logging (not straight to fd 2), and a clean close logs
    nothing worth a warning."""
    names = Topics.of(topics)
    p = Producer(topics.producer_config())
    p.produce(names.events, key=b"k", value=b"v")
    assert p.flush(30) == 0
    del p
    c = Consumer(topics.consumer_config(f"t-quiet-{uuid.uuid4().hex[:8]}"))
    c.subscribe([names.events])
    deadline = time.monotonic() + 30
    while not c.assignment() and time.monotonic() < deadline:
        c.poll(0.2)
    assert c.assignment()
    c.close()
    c = Consumer(topics.consumer_config(f"t-quiet-{uuid.uuid4().hex[:8]}"))
    c.get_watermark_offsets(TopicPartition(names.events, 0), timeout=10)
    c.close()
    AdminClient(topics.admin_config()).list_topics(timeout=10)
    assert capfd.readouterr().err == ""


def test_group_ids_of_a_real_consumer_carry_the_prefix(topics: Settings) -> None:
    from confluent_kafka import ConsumerGroupTopicPartitions

    names = Topics.of(topics)
    c = Consumer(topics.consumer_config("t-grp"))
    c.commit(offsets=[TopicPartition(names.events, 0, 0)], asynchronous=False)
    c.close()
    group = f"{topics.topic_prefix}t-grp"
    admin = AdminClient(topics.admin_config())
    got = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(30)
    assert [(tp.topic, tp.offset) for tp in got.topic_partitions] == [(names.events, 0)]
    admin.delete_consumer_groups([group])[group].result(30)


# -- Redis over mutual TLS --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki() -> Pki:
    return make_pki()


@pytest.fixture
def tls_redis(pki: Pki, tmp_path: Path) -> Iterator[str]:
    """A throw-away redis-server with TLS only (client certificates required); its rediss:// URL."""
    server = shutil.which("redis-server")
    require(server is not None, "no redis-server (deploy/local/up installs it)")
    assert server is not None
    for name, text in (("server.pem", pki.server_pem), ("server.key", pki.server_key_pem),
                       ("ca.pem", pki.ca_pem)):
        (tmp_path / name).write_text(text)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [server, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
            "--tls-cert-file", str(tmp_path / "server.pem"), "--tls-key-file", str(tmp_path / "server.key"),
            "--tls-ca-cert-file", str(tmp_path / "ca.pem"), "--tls-auth-clients", "yes",
            "--save", "", "--appendonly", "no", "--dir", str(tmp_path)]
    with open(tmp_path / "redis.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None:
                    require(False, "redis-server without TLS: "
                                   f"{(tmp_path / 'redis.log').read_text()[-500:]}")
                time.sleep(0.1)
        yield f"rediss://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


def test_redis_mutual_tls_from_the_settings(tls_redis: str, pki: Pki, tmp_path: Path) -> None:
    (tmp_path / "ca-copy.pem").write_text(pki.ca_pem)
    (tmp_path / "client.pem").write_text(pki.client_pem)
    (tmp_path / "client.key").write_text(pki.client_key_encrypted_pem)
    env = {"REDIS_URL": tls_redis, "RUNLOG_REDIS_PREFIX": "tls",
           "RUNLOG_REDIS_SSL_CA_CERTS": str(tmp_path / "ca-copy.pem"),
           "RUNLOG_REDIS_SSL_CERTFILE": str(tmp_path / "client.pem"),
           "RUNLOG_REDIS_SSL_KEYFILE": str(tmp_path / "client.key"),
           "RUNLOG_REDIS_SSL_KEY_PASSWORD": "k3y-pass"}
    s = Settings.from_env(env)
    r = redis.Redis.from_url(s.redis_url, **s.redis_kwargs())
    try:
        assert r.ping()
        store = RedisStore.from_settings(s)  # loads the apply script over TLS
        assert store.marker() is None
    finally:
        r.close()
    # the inline CA does the same
    inline = Settings.from_env({**env, "RUNLOG_REDIS_SSL_CA_CERTS": "",
                                "RUNLOG_REDIS_SSL_CA_PEM": pki.ca_pem})
    r = redis.Redis.from_url(inline.redis_url, **inline.redis_kwargs())
    try:
        assert r.ping()
    finally:
        r.close()
    # without the client certificate the server refuses the handshake
    bare = Settings.from_env({"REDIS_URL": tls_redis, "RUNLOG_REDIS_SSL_CA_PEM": pki.ca_pem})
    r = redis.Redis.from_url(bare.redis_url, **bare.redis_kwargs())
    try:
        with pytest.raises(redis.ConnectionError):
            r.ping()
    finally:
        r.close()


# -- rebuild under a Redis ACL ----------------------------------------------------------------------


def test_rebuild_default_target_works_under_an_acl_limited_to_the_prefix(
    topics: Settings, redis_client: redis.Redis
) -> None:
    runs = [full_run(f"acl-{i}", stages=2) for i in range(3)]
    produce(topics, [e for evs in runs for e in evs])
    user, password = f"t-acl-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    prefix = topics.redis_prefix
    redis_client.acl_setuser(user, enabled=True, passwords=[f"+{password}"], keys=[f"{prefix}:*"],
                             commands=["+@all"])
    try:
        limited = topics.with_(redis_username=user, redis_password=password)
        argv = [sys.executable, "-m", "runlog", "projections", "rebuild", "--json", "--quiet"]
        out = subprocess.run(argv, cwd=ROOT, env={**env_of(limited), **limited.to_env()}, capture_output=True,
                             text=True, timeout=180, check=False)
        assert out.returncode == 0, out.stdout + out.stderr
        doc = json.loads(out.stdout)
        assert doc["target"] == f"{prefix}:rebuild" and doc["applied"] == sum(len(r) for r in runs)
        states = RedisStore(redis_client, f"{prefix}:rebuild").load_states([r[0].run_id for r in runs])
        assert len(states) == 3
        # the former default, the sibling <prefix>.rebuild, is outside such an ACL
        with pytest.raises((redis.exceptions.NoPermissionError, ProjectionStoreError)):
            rebuild(limited, f"{prefix}.rebuild", progress=None)
    finally:
        redis_client.acl_deluser(user)


def test_env_of_is_not_leaking_redis_tls_settings() -> None:
    """The harness's child environment starts from os.environ minus RUNLOG_*: a developer's own
    RUNLOG_REDIS_SSL_* cannot reach a child that talks to the plain test Redis."""
    os.environ["RUNLOG_REDIS_SSL_CA_CERTS"] = "/nonexistent"
    try:
        assert "RUNLOG_REDIS_SSL_CA_CERTS" not in env_of(Settings.from_env({}))
    finally:
        del os.environ["RUNLOG_REDIS_SSL_CA_CERTS"]
