"""Runlog on a real Redis Cluster (``deploy/local/redis-cluster``: 3 masters + 3 replicas on
loopback), with ``REDIS_URL=redis+cluster://...``: leases, the effects ledger, run keys and the
active-runs registry (sync and asyncio faces), the projection store contract, a Runner and an
AsyncRunner run end to end, and ``runlog doctor`` refusing a standalone URL to a cluster node.

The cluster and the fixtures pointing at it: ``conftest.py``. ``rebuild --swap`` on the cluster:
``test_cluster_swap.py``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.cluster

from runlog.processors.admin import RedisModeMismatch, check_redis
from runlog.producers import AsyncRunner, Runner
from runlog.producers.base._redis_io import run
from runlog.producers.calls._ledger import RedisEffectLedger
from runlog.producers.log._lease import RedisLeaseManager
from runlog.producers.run._active import ActiveRuns
from runlog.producers.run._runs import RunKeys
from runlog.projections import RedisStore, RunStatus
from runlog.schemas import Settings
from runlog.schemas._redis import aredis_client, index_shard, redis_client
from tests.integration.producers.conftest import SOURCE
from tests.integration.producers.helpers import events_of, read_events
from tests.integration.producers.redis_lease_faces import AsyncRedisLeaseCase, RedisLeaseCase
from tests.integration.producers.test_write_path import EXPECTED, content_workflow
from tests.integration.resume.conftest import DemoWorld, served_world
from tests.unit.producers.ledger_contract import LedgerContract
from tests.unit.projections.runlogs import full_run
from tests.unit.projections.store_contract import StoreContract, fold_updates

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


def _slot(c: Any, key: str | bytes) -> int:
    return int(c.keyslot(key))


# -- leases, ledger: the shared contracts, on both faces ---------------------------------------


class TestClusterLease(RedisLeaseCase):
    @pytest.fixture(autouse=True)
    def _redis(self, settings: Settings, redis_client_: Any) -> None:
        self.settings, self.client = settings, redis_client_


class TestAsyncClusterLease(AsyncRedisLeaseCase, TestClusterLease):
    @pytest.fixture(autouse=True)
    def _aclient(self, _redis: None) -> None:
        self.aclient = aredis_client(self.settings)


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
        self.redis.delete(self.store.indexes.shard_status_hash(shard),
                          *self.store.status_keys(ups[-1].state.status))
        assert self.store.runs() == []
        assert self.store.apply(ups[-1:]) == [self.store.apply(ups[-1:])[0]]  # ALREADY, index written again
        assert self.store.runs(ups[-1].state.status) == ["run-9"]

    def test_a_node_that_came_back_empty_is_a_lost_namespace(self) -> None:
        from runlog.projections import ProjectionLost

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
        assert any(isinstance(x, redis.cluster.RedisCluster) for x in r._owned)
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
            aclients = [x for x in r._owned if isinstance(x, redis.asyncio.RedisCluster)]
            clients = [x for x in r._owned if isinstance(x, redis.cluster.RedisCluster)]
            assert len(aclients) == 1  # the runs' client
            assert len(clients) == 2  # the sync client and the lease heartbeat thread's own
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
    proc = subprocess.run([sys.executable, "-m", "runlog", "doctor"], capture_output=True, text=True,
                          timeout=120, check=False, env=env, cwd=ROOT)
    assert proc.returncode != 0, proc.stdout
    assert "redis+cluster://" in proc.stdout and "cluster_enabled:1" in proc.stdout
    assert "all good" not in proc.stdout


def test_the_ledger_finds_an_effect_only_the_sharded_projection_knows(settings: Settings,
                                                                       redis_client_: Any) -> None:
    store = RedisStore(redis_client_, settings.redis_prefix)
    store.apply(fold_updates(full_run("run-old", stages=6)))
    (dk,) = [k.decode() for k in redis_client_.hkeys(store.effects_key("run-old"))][:1]
    ledger = RedisEffectLedger(redis_client_, settings.redis_prefix)
    assert ledger.index_key_of(dk) == store.effect_index_key_of(dk) != ledger.index_key
    found = ledger.lookup(dk)
    assert found is not None and found.source == "projection" and found.run_id == "run-old"


def test_scripts_flushed_on_every_node_are_loaded_again(settings: Settings, redis_client_: Any) -> None:
    store = RedisStore(redis_client_, settings.redis_prefix)
    ups = fold_updates(full_run("r-flush", stages=1))
    store.apply(ups[:2])
    redis_client_.execute_command("SCRIPT FLUSH", target_nodes=redis.cluster.RedisCluster.ALL_NODES)
    assert store.apply(ups[2:])
    assert store.load_state("r-flush") == ups[-1].state
    leases = RedisLeaseManager(redis_client_, settings, holder="h")
    try:
        lease = leases.acquire("r-flush")
        redis_client_.execute_command("SCRIPT FLUSH", target_nodes=redis.cluster.RedisCluster.ALL_NODES)
        assert lease.heartbeat()
        other = leases.acquire("r-flush-2")
        run(leases._beat_all(), redis_client_)  # the heartbeat thread's pipelined EVAL over two slots
        assert not lease.lost and not other.lost
        lease.release()
        assert redis_client_.get(leases.lease_key("r-flush")) is None
    finally:
        leases.close()


# -- the projector and rebuild --diff --------------------------------------------------------------


def test_the_projector_on_the_cluster_recovers_an_emptied_namespace_and_equals_a_rebuild(
        topics: Settings, redis_client_: Any, tmp_path: Path) -> None:
    from runlog.projections import diff_namespaces
    from tests.integration.processors.harness import (
        converges,
        interleave,
        produce,
        reference,
        start_projector,
        stop,
        wait_until,
    )

    runs = [full_run(f"run-{i:03d}", stages=1 + i % 6) for i in range(30)]
    stream = interleave(runs)
    cut = len(stream) * 2 // 3
    produce(topics, stream[:cut])
    store = RedisStore(redis_client_, topics.redis_prefix)
    proc = start_projector(topics, f"{topics.topic_prefix}proj", log=tmp_path / "p.log")
    try:
        caught_up = wait_until(lambda: len(store.runs()) == 30, 120, every=0.5)
        assert caught_up, (tmp_path / "p.log").read_text()[-3000:]
        # the cluster emptied under the running projector (every node): the next batch is refused as
        # lost and the projector rebuilds the namespace from the log, then goes on
        for k in list(redis_client_.scan_iter(match=f"{topics.redis_prefix}:*")):
            redis_client_.delete(k)
        produce(topics, stream[cut:])
        assert wait_until(lambda: "rebuilding it from the log" in (tmp_path / "p.log").read_text(), 120), \
            (tmp_path / "p.log").read_text()[-3000:]
        ref = reference(topics, redis_client_)
        assert converges(topics, redis_client_, ref, timeout=120) == []
    finally:
        stop(proc)
    assert len(store.runs(RunStatus.COMPLETED)) == sum(1 for r in runs if r[-1].type.value == "RUN_COMPLETED")
    keys = {k.decode() for k in redis_client_.scan_iter(match=f"{topics.redis_prefix}:*")}
    assert any("{idx:" in k for k in keys) and f"{topics.redis_prefix}:effects:by_key" not in keys
    assert diff_namespaces(redis_client_, topics.redis_prefix, ref) == []
    proc2 = subprocess.run([sys.executable, "-m", "runlog", "projections", "rebuild", "--diff"],
                           capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
                           env={**os.environ, **topics.to_env()})
    assert proc2.returncode == 0, proc2.stdout + proc2.stderr
    assert "0 keys differ" in proc2.stdout, proc2.stdout


# -- a master killed in the middle of a run ------------------------------------------------------


def _cluster_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ROOT / "deploy" / "local" / "redis-cluster"), *args], capture_output=True,
                          text=True, timeout=300, check=False)


@pytest.mark.slow
def test_a_master_killed_mid_run_fails_over_and_the_run_completes(topics: Settings, cluster_url: str) -> None:
    """SIGKILL the master owning the run's slot while the run is inside a stage: its replica is
    promoted (cluster-node-timeout 3 s) and the writer's client follows the new slot map; the lease
    (a 15 s ttl: longer than the failover) survives on the replica, the run completes under epoch 1,
    and its effects ledger claim is where the replica took it."""
    import threading
    import time

    from runlog.producers import CallInfo, ReplayPolicy, StageContext, Workflow, tool

    if os.environ.get("RUNLOG_TEST_REDIS_CLUSTER_URL"):
        pytest.skip("a cluster from RUNLOG_TEST_REDIS_CLUSTER_URL is not ours to kill nodes of")
    settings = topics.with_(lease_ttl_ms=15_000)
    entered, release = threading.Event(), threading.Event()

    @tool("post", policy=ReplayPolicy.IDEMPOTENT, effect=True, target="sink:posts",
          delivery=lambda a, c: ("acct", "sink", c.run_id, str(a["n"])))
    def post(call: CallInfo, n: int) -> dict[str, Any]:
        return {"external_id": f"post-{call.run_id}-{n}"}

    wf = Workflow("failover", "1")

    @wf.stage("first")
    def first(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        out = ctx.call(post, n=1)
        entered.set()
        assert release.wait(120)
        return {"id": out["external_id"]}

    @wf.stage("second")
    def second(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"id": ctx.call(post, n=2)["external_id"]}

    c = redis_client(settings)
    killed: int | None = None
    result: list[Any] = []
    try:
        with Runner.from_settings(settings) as r:
            t = threading.Thread(target=lambda: result.append(r.run(wf, {"x": 1})), daemon=True)
            t.start()
            assert entered.wait(60)
            ((run_id, _),) = ActiveRuns(c, settings.redis_prefix).list()
            lease_key = RedisLeaseManager(c, settings).lease_key(run_id)
            node = c.get_node_from_key(lease_key)
            killed = int(node.port) - int(os.environ.get("RUNLOG_REDIS_CLUSTER_PORT") or 17001) + 1
            assert _cluster_script("kill", str(killed)).returncode == 0

            def promoted() -> bool:
                try:
                    c.nodes_manager.initialize()
                    new = c.get_node_from_key(lease_key)
                    return int(new.port) != int(node.port) and c.get(lease_key) is not None
                except Exception:  # noqa: BLE001 - the cluster is between states
                    return False

            deadline = time.monotonic() + 60
            while not promoted():
                assert time.monotonic() < deadline, "no replica was promoted within 60 s"
                time.sleep(0.5)
            release.set()
            t.join(120)
        assert result and result[0].completed, result
        assert c.get(f"{settings.redis_prefix}:{{{run_id}}}:epoch") == b"1"
        events = [x.event for x in events_of(read_events(settings), run_id)]
        assert events[-1].type.value == "RUN_COMPLETED" and {e.epoch for e in events} == {1}
    finally:
        release.set()
        c.close()
        if killed is not None:
            _cluster_script("start", str(killed))


# -- the demo: a crash, the resumer, on the cluster ------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("sdk", ["sync", "async"])
def test_the_demo_crashes_and_resumes_through_the_resumer_on_the_cluster(topics: Settings, tmp_path: Path,
                                                                         sdk: str) -> None:
    from runlog.processors.demo.run import DEFAULT_CRASH_AT, run_demo

    r = run_demo(topics, quiet=True, workdir=tmp_path / "demo", sdk=sdk)
    assert r["crashed_at"] == DEFAULT_CRASH_AT and r["resume"] == "completed" and r["completed"] is True
    ref = r["reference"]
    assert r["publishes"] == ref["publishes"] == 1 and r["renders_billed"] == ref["renders_billed"] == 3
    assert r["final_artifacts"] == ref["final_artifacts"] and r["epochs"] == [1, 2]


# -- the resumer: requests, the sweep of dead runs, dead letters ------------------------------------


@pytest.fixture
def demo_world(tmp_path: Path) -> Iterator[DemoWorld]:
    with served_world(tmp_path / "world") as w:
        yield w


@pytest.mark.slow
def test_the_resumer_group_and_its_sweep_on_the_cluster(topics: Settings, demo_world: DemoWorld,
                                                        tmp_path: Path) -> None:
    """The resumer service's own test, with every Redis key on the cluster: a requested resume, the
    sweep finding the dead run among the projection's RUNNING ones (fanned out over the shards) and
    the active-runs registry, junk to the dead-letter topic."""
    from tests.integration.resume.test_resumer_service import (
        test_resumer_group_resumes_requests_sweeps_dead_runs_and_dead_letters_junk as resumer_case,
    )

    assert topics.redis_url.startswith("redis+cluster://")
    resumer_case(topics, demo_world, tmp_path)
