"""Runlog on a Redis Cluster that speaks TLS only (``rediss+cluster://``): the local cluster of
``deploy/local/redis-cluster`` with ``RUNLOG_REDIS_CLUSTER_TLS=1`` (TLS for clients, the cluster bus and
replication; clients must present a certificate), on its own ports (``RUNLOG_REDIS_CLUSTER_PORT``,
default 17101: the plain cluster's bus ports are 27001-27006) and its own state dir, beside the plain
cluster of ``conftest.py``.

Over it: the lease, ledger and store contracts, a Runner run end to end with a ``runlog project``
process folding it (``RUNLOG_REDIS_SSL_CA_CERTS``, ``_CERTFILE``, ``_KEYFILE`` from the script), equal to
a rebuild; and the refusals that show TLS is real: no client certificate, the system CAs instead of the
cluster's CA, a plain ``redis+cluster://`` URL.
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
import redis
import redis.cluster

import tests.integration.cluster.test_redis_cluster as plain
from runlog.producers import Runner
from runlog.projections import RedisStore, RunStatus, diff_namespaces
from runlog.schemas import Settings
from runlog.schemas._redis import redis_client
from tests.conftest import require
from tests.integration.producers.conftest import SOURCE
from tests.integration.producers.test_write_path import content_workflow

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
TLS_PORT = int(os.environ.get("RUNLOG_TEST_REDIS_TLS_CLUSTER_PORT") or 17101)


@pytest.fixture(scope="module")
def tls_cluster() -> Iterator[dict[str, str]]:
    """The TLS cluster's export lines (``REDIS_URL``, ``RUNLOG_REDIS_SSL_*``); stopped at the end when
    this module started it."""
    require(shutil.which("redis-server") and shutil.which("redis-cli") and shutil.which("openssl"),
            "redis-server, redis-cli or openssl is missing: no local TLS cluster")
    env = {**os.environ, "RUNLOG_REDIS_CLUSTER_TLS": "1", "RUNLOG_REDIS_CLUSTER_PORT": str(TLS_PORT),
           "RUNLOG_LOCAL_DIR": str(ROOT / ".runlog" / "tls-cluster")}
    script = str(ROOT / "deploy" / "local" / "redis-cluster")
    status = subprocess.run([script, "status"], capture_output=True, text=True, timeout=60, check=False,
                            env=env)
    was_running = " pid " in status.stdout
    proc = subprocess.run([script, "up"], capture_output=True, text=True, timeout=600, check=False, env=env)
    # e.g. a redis-server built without TLS (BUILD_TLS=no): "Bad directive" at tls-port
    require(proc.returncode == 0, f"RUNLOG_REDIS_CLUSTER_TLS=1 deploy/local/redis-cluster up failed "
            f"({proc.returncode}; a redis-server without TLS support?):\n{proc.stderr[-3000:]}")
    found = {}
    for line in proc.stdout.splitlines():
        if line.startswith("export "):
            k, v = line[len("export "):].split("=", 1)
            found[k] = shlex.split(v)[0]
    assert found["REDIS_URL"].startswith("rediss+cluster://127.0.0.1:"), proc.stdout
    yield found
    if not was_running:
        subprocess.run([script, "down"], capture_output=True, text=True, timeout=120, check=False, env=env)


def _on_tls(s: Settings, tls: dict[str, str]) -> Settings:
    return s.with_(redis_url=tls["REDIS_URL"], redis_ssl_ca_certs=tls["RUNLOG_REDIS_SSL_CA_CERTS"],
                   redis_ssl_certfile=tls["RUNLOG_REDIS_SSL_CERTFILE"],
                   redis_ssl_keyfile=tls["RUNLOG_REDIS_SSL_KEYFILE"])


@pytest.fixture
def settings(settings: Settings, tls_cluster: dict[str, str]) -> Settings:
    """The test's settings (own prefixes) on the TLS cluster (its keys go with the namespace's cleanup)."""
    return _on_tls(settings, tls_cluster)


# -- the contracts, as on the plain cluster (the same classes, these fixtures) ----------------------


class TestTlsClusterLease(plain.TestClusterLease):
    pass


class TestTlsClusterLedger(plain.TestClusterLedger):
    pass


class TestTlsAsyncClusterLedger(plain.TestAsyncClusterLedger):
    pass


class TestTlsClusterStore(plain.TestClusterStore):
    pass


# -- TLS is really asked for ------------------------------------------------------------------------


def _ping(s: Settings) -> None:
    c = redis_client(s, socket_connect_timeout=5)
    try:
        c.ping()
    finally:
        c.close()


def test_replicas_follow_their_masters_over_tls(redis_client_: Any) -> None:
    from tests.integration.processors.harness import wait_until

    replicas = redis_client_.get_replicas()
    assert len(replicas) == 3

    def linked() -> bool:
        infos = redis_client_.info("replication", target_nodes=replicas)
        return all(i.get("master_link_status") == "up" for i in infos.values())

    assert wait_until(linked, 60, every=0.5), redis_client_.info("replication", target_nodes=replicas)


def test_the_tls_cluster_refuses_plain_text_a_wrong_ca_and_no_client_certificate(settings: Settings) -> None:
    _ping(settings)
    url = settings.redis_url
    bare = settings.with_(redis_ssl_ca_certs=None, redis_ssl_certfile=None, redis_ssl_keyfile=None)
    refused = [
        ("plain text", bare.with_(redis_url=url.replace("rediss+cluster://", "redis+cluster://"))),
        ("the system CAs", settings.with_(redis_ssl_ca_certs=None)),
        ("no client certificate", settings.with_(redis_ssl_certfile=None, redis_ssl_keyfile=None)),
    ]
    for what, s in refused:
        with pytest.raises((redis.RedisError, redis.cluster.RedisClusterException)):
            _ping(s)
            pytest.fail(f"the TLS cluster answered a client with {what}")


# -- a Runner and the projector over TLS --------------------------------------------------------------


def test_a_runner_and_the_projector_over_rediss_cluster_equal_a_rebuild(
        topics: Settings, tls_cluster: dict[str, str], tmp_path: Path) -> None:
    from tests.integration.processors.harness import converges, reference, start_projector, stop, wait_until

    s = _on_tls(topics, tls_cluster)
    c = redis_client(s)
    store = RedisStore(c, s.redis_prefix)
    ssl_env = {k: v for k, v in tls_cluster.items() if k.startswith("RUNLOG_REDIS_SSL_")}
    proc = start_projector(s, f"{s.topic_prefix}proj", log=tmp_path / "p.log", **ssl_env)
    try:
        with Runner.from_settings(s, source=SOURCE) as r:
            results = [r.run(content_workflow(), {"topic": f"tls-{i}"}, inputs={"facts": "v1"})
                       for i in range(3)]
        assert all(x.completed for x in results)
        ids = {x.run_id for x in results}
        assert wait_until(lambda: set(store.runs(RunStatus.COMPLETED)) == ids, 120, every=0.5), \
            (tmp_path / "p.log").read_text()[-3000:]
        ref = reference(s, c)
        assert converges(s, c, ref, timeout=60) == []
        assert diff_namespaces(c, s.redis_prefix, ref) == []
    finally:
        stop(proc)
        c.close()
