"""Runlog on a real Redis Cluster (``deploy/local/redis-cluster``: 3 masters + 3 replicas on
loopback), with ``REDIS_URL=redis+cluster://...``: leases, the effects ledger, run keys and the
active-runs registry (sync and asyncio faces), the projection store contract, a Runner and an
AsyncRunner run end to end, and ``runlog doctor`` refusing a standalone URL to a cluster node.

The cluster comes from ``RUNLOG_TEST_REDIS_CLUSTER_URL`` when set, else ``deploy/local/redis-cluster up``
(idempotent: a cluster already up is reused). The tests skip, saying why, only when it cannot start.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.cluster

from processors.admin import RedisModeMismatch, check_redis
from producers import AsyncRunner, Runner
from producers._active import ActiveRuns
from producers._lease import AsyncRedisLeaseManager, RedisLeaseManager
from producers._ledger import RedisEffectLedger
from producers._runs import RunKeys
from projections import RedisStore, RunStatus
from schemas import Settings
from schemas._redis import aredis_client, index_shard, redis_client
from tests.integration.producers.conftest import SOURCE
from tests.integration.producers.helpers import events_of, read_events
from tests.integration.producers.test_write_path import EXPECTED, content_workflow
from tests.unit.producers.lease_contract import LeaseContract
from tests.unit.producers.ledger_contract import LedgerContract
from tests.unit.projections.runlogs import full_run
from tests.unit.projections.store_contract import StoreContract, fold_updates

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def cluster_url() -> str:
    env = os.environ.get("RUNLOG_TEST_REDIS_CLUSTER_URL")
    if env:
        return env
    if not (shutil.which("redis-server") and shutil.which("redis-cli")):
        pytest.skip("redis-server / redis-cli are not installed: deploy/local/redis-cluster cannot start a cluster")
    proc = subprocess.run([str(ROOT / "deploy" / "local" / "redis-cluster"), "up"], capture_output=True,
                          text=True, timeout=600, check=False)
    if proc.returncode != 0:
        pytest.skip(f"deploy/local/redis-cluster up failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    for line in proc.stdout.splitlines():
        if line.startswith("export REDIS_URL="):
            return shlex.split(line[len("export "):])[0].split("=", 1)[1]
    pytest.skip(f"deploy/local/redis-cluster up printed no REDIS_URL:\n{proc.stdout}")


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


def _slot(c: Any, key: str | bytes) -> int:
    return int(c.keyslot(key))


# -- leases, ledger: the shared contracts, on both faces ---------------------------------------


class TestClusterLease(LeaseContract):
    @pytest.fixture(autouse=True)
    def _redis(self, settings: Settings, redis_client_: Any) -> Iterator[None]:
        self.settings, self.client = settings, redis_client_
        self.managers: list[RedisLeaseManager] = []
        yield
        for m in self.managers:
            m.close()

    def manager(self, holder: str) -> RedisLeaseManager:
        m = RedisLeaseManager(self.client, self.settings, holder=holder)
        self.managers.append(m)
        return m

    def expire(self, run_id: str) -> None:
        self.client.delete(RedisLeaseManager(self.client, self.settings).lease_key(run_id))


class TestAsyncClusterLease(TestClusterLease):
    @pytest.fixture(autouse=True)
    def _aclient(self, _redis: None) -> None:
        self.aclient = aredis_client(self.settings)

    def manager(self, holder: str) -> AsyncRedisLeaseManager:
        m = AsyncRedisLeaseManager(self.client, self.aclient, self.settings, holder=holder)
        self.managers.append(m)
        return m

    async def aclean(self) -> None:
        for m in self.managers:
            await m.aclose()
        await self.aclient.aclose()


class TestClusterLedger(LedgerContract):
    @pytest.fixture(autouse=True)
    def _ledger(self, settings: Settings, redis_client_: Any) -> None:
        self.ledger = RedisEffectLedger(redis_client_, settings.redis_prefix)


class TestAsyncClusterLedger(LedgerContract):
    @pytest.fixture(autouse=True)
    def _ledger(self, settings: Settings, redis_client_: Any) -> None:
        self.aclient = aredis_client(settings)
        self.ledger = RedisEffectLedger(redis_client_, settings.redis_prefix, aclient=self.aclient)

    async def aclean(self) -> None:
        await self.aclient.aclose()


def test_run_keys_and_active_runs_on_the_cluster(settings: Settings, redis_client_: Any) -> None:
    keys = RunKeys(redis_client_, settings.redis_prefix)
    first = keys.claim("order-1", "run-a", "p1", "wf")
    assert first.run_id == "run-a" and keys.claim("order-1", "run-b", "p1", "wf").run_id == "run-a"
    active = ActiveRuns(redis_client_, settings.redis_prefix)
    active.add("run-a", "wf", at_ms=1)
    active.add("run-b", "wf2", at_ms=2)
    assert active.list() == [("run-a", "wf"), ("run-b", "wf2")] and "run-a" in active
    active.wait("run-b", "wf2", 5)
    assert active.due(10) == [("run-b", "wf2")]
    active.cancel("run-a")
    assert active.list() == [] and active.cancelled(["run-a", "run-b"]) == {"run-a"}


# -- the projection store -----------------------------------------------------------------------


class TestClusterStore(StoreContract):
    @pytest.fixture(autouse=True)
    def _store(self, settings: Settings, redis_client_: Any) -> None:
        self.store = RedisStore(redis_client_, settings.redis_prefix)
        self.redis = redis_client_
        self.prefix = settings.redis_prefix

    def test_every_script_touches_one_slot_and_indexes_are_sharded(self) -> None:
        assert self.store.cluster
        ups = fold_updates(full_run("run-42", stages=4))
        self.store.apply(ups)
        p = self.prefix
        keys = {k.decode() for k in self.redis.scan_iter(match=f"{p}:*")}
        run_keys = {f"{p}:{{run-42}}:state", f"{p}:{{run-42}}:checkpoints", f"{p}:{{run-42}}:effects"}
        assert run_keys <= keys and len({_slot(self.redis, k) for k in run_keys}) == 1
        n = index_shard("run-42")
        assert f"{p}:{{idx:{n}}}:runs:by_status:RUNNING" in keys and f"{p}:{{idx:{n}}}:runs:status" in keys
        assert not any(":runs:by_status:" in k and "{idx:" not in k for k in keys)
        (dk,) = self.redis.hkeys(self.store.effects_key("run-42"))
        assert f"{p}:{{idx:{index_shard(dk.decode())}}}:effects:by_key" in keys
        assert self.store.runs(RunStatus.RUNNING) == ["run-42"] and self.store.count(RunStatus.RUNNING) == 1
        assert self.store.effect(dk.decode()) is not None

    def test_many_runs_spread_over_the_shards_list_in_time_order(self) -> None:
        ids = [f"run-{i}" for i in range(24)]
        for r in ids:
            self.store.apply(fold_updates(full_run(r, stages=1)))
        assert sorted(self.store.runs()) == sorted(ids)
        assert len({index_shard(r) for r in ids}) > 4

    def test_an_index_write_lost_in_a_crash_is_completed_by_the_redelivery(self) -> None:
        ups = fold_updates(full_run("run-9", stages=1))
        self.store.apply(ups)
        shard = index_shard("run-9")
        self.redis.delete(self.store.shard_status_hash(shard), *self.store.status_keys(ups[-1].state.status))
        assert self.store.runs() == []
        assert self.store.apply(ups[-1:]) == [self.store.apply(ups[-1:])[0]]  # ALREADY, index written again
        assert self.store.runs(ups[-1].state.status) == ["run-9"]

    def test_a_node_that_came_back_empty_is_a_lost_namespace(self) -> None:
        from projections import ProjectionLost

        ups = fold_updates(full_run("run-7", stages=2))
        self.store.apply(ups[:4])
        for k in ("state", "checkpoints", "effects"):
            self.redis.delete(f"{self.prefix}:{{run-7}}:{k}")
        with pytest.raises(ProjectionLost):
            self.store.apply(ups[4:])


# -- a Runner and an AsyncRunner end to end ------------------------------------------------------


def test_a_runner_runs_a_workflow_end_to_end_on_the_cluster(topics: Settings, cluster_url: str) -> None:
    assert topics.redis_url == cluster_url
    with Runner.from_settings(topics, source=SOURCE) as r:
        result = r.run(content_workflow(), {"topic": "kafka"}, inputs={"facts": "v1"})
        assert isinstance(r._owned[1], redis.cluster.RedisCluster)
    assert result.completed
    events = [x.event for x in events_of(read_events(topics), result.run_id)]
    assert [(e.type, e.stage, e.call_id) for e in events] == EXPECTED
    c = redis_client(topics)
    try:
        assert c.get(f"{topics.redis_prefix}:{{{result.run_id}}}:epoch") == b"1"
        assert ActiveRuns(c, topics.redis_prefix).list() == []
    finally:
        c.close()


def test_an_async_runner_runs_a_workflow_end_to_end_on_the_cluster(topics: Settings) -> None:
    async def main() -> Any:
        async with AsyncRunner.from_settings(topics, source=SOURCE) as r:
            assert isinstance(r._owned[2], redis.asyncio.RedisCluster)
            return await r.run(content_workflow(), {"topic": "kafka"}, inputs={"facts": "v1"})

    result = asyncio.run(main())
    assert result.completed
    events = [x.event for x in events_of(read_events(topics), result.run_id)]
    assert [(e.type, e.stage, e.call_id) for e in events] == EXPECTED


# -- runlog doctor -----------------------------------------------------------------------------


def test_doctor_refuses_a_standalone_url_to_a_cluster_node(settings: Settings, cluster_url: str) -> None:
    first = cluster_url.split("://", 1)[1].split(",")[0]
    standalone = settings.with_(redis_url=f"redis://{first}/0")
    with pytest.raises(RedisModeMismatch, match=r"redis\+cluster://"):
        check_redis(standalone)
    assert check_redis(settings)["redis_mode"] == "cluster"
    env = {**os.environ, **standalone.to_env()}
    proc = subprocess.run([sys.executable, "-m", "processors.cli", "doctor"], capture_output=True, text=True,
                          timeout=120, check=False, env=env, cwd=ROOT)
    assert proc.returncode != 0, proc.stdout
    assert "redis+cluster://" in proc.stdout and "cluster_enabled:1" in proc.stdout
    assert "all good" not in proc.stdout
