"""The projection store waits for replicas on the cluster (``runlog.projections._replicas``): an apply sends
``WAIT`` to every primary it wrote to, a replica that does not acknowledge (its process stopped)
fails the apply with ``ReplicasBehind`` after the timeout, and the next apply (the projector's retry,
which has nothing of its own to write) sends the kept batch again and completes it."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
import redis

from runlog.projections import RedisStore
from runlog.projections._replicas import ReplicasBehind
from runlog.schemas import Settings
from runlog.schemas._redis import index_shard
from tests.integration.processors.harness import wait_until
from tests.unit.projections.runlogs import full_run
from tests.unit.projections.store_contract import fold_updates

pytestmark = pytest.mark.integration


def _node(node: Any) -> redis.Redis:
    return redis.Redis(host=node.host, port=int(node.port))


def _waits(node: Any) -> int:
    """How many WAIT commands ``node`` has run."""
    c = _node(node)
    try:
        return int(c.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))
    finally:
        c.close()


def _replica_linked(node: Any) -> bool:
    c = _node(node)
    try:
        info = c.info("replication")
    finally:
        c.close()
    return bool(info.get("slave0", {}).get("state") == "online")


def test_an_apply_waits_on_every_primary_it_wrote_to(settings: Settings, redis_client_: Any) -> None:
    store = RedisStore(redis_client_, settings.redis_prefix)  # RUNLOG_REDIS_WAIT_REPLICAS's default: auto
    assert store.waits.enabled and store.waits.replicas is None
    run_id = "run-waited"
    ups = fold_updates(full_run(run_id, stages=2))
    status_hash = store.indexes.shard_status_hash(index_shard(run_id))
    written = {redis_client_.get_node_from_key(store.state_key(run_id)).name: None,
               redis_client_.get_node_from_key(status_hash).name: None}
    primaries = {n.name: n for n in redis_client_.get_primaries()}
    assert wait_until(lambda: all(_replica_linked(primaries[n]) for n in written), 60, every=0.5), \
        "the primaries written to have no online replica"
    before = {n: _waits(primaries[n]) for n in written}
    store.apply(ups)
    after = {n: _waits(primaries[n]) for n in written}
    assert all(after[n] > before[n] for n in written), (before, after)
    assert store.runs(ups[-1].state.status) == [run_id]


def test_a_replica_that_does_not_acknowledge_fails_the_apply_and_the_retry_completes_it(
        settings: Settings, redis_client_: Any) -> None:
    if os.environ.get("RUNLOG_TEST_REDIS_CLUSTER_URL"):
        pytest.skip("a cluster from RUNLOG_TEST_REDIS_CLUSTER_URL is not ours to stop nodes of")
    store = RedisStore(redis_client_, settings.redis_prefix, wait_ms=300)
    run_id = "run-unreplicated"
    primary = redis_client_.get_node_from_key(store.state_key(run_id))
    assert wait_until(lambda: _replica_linked(primary), 60, every=0.5), "no online replica"
    c = _node(primary)
    try:
        replica = c.info("replication")["slave0"]
    finally:
        c.close()
    if replica["ip"] not in ("127.0.0.1", "::1", "localhost"):
        pytest.skip(f"the replica {replica['ip']} is not a process of this machine")
    rc = redis.Redis(host=replica["ip"], port=int(replica["port"]))
    try:
        pid = int(rc.info("server")["process_id"])
    finally:
        rc.close()
    ups = fold_updates(full_run(run_id, stages=1))
    os.kill(pid, signal.SIGSTOP)  # alive for its master (the link stays up), acknowledging nothing
    try:
        with pytest.raises(ReplicasBehind, match=f"node {primary.name} was answered by 0 of 1 replicas"):
            store.apply(ups)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert store.load_state(run_id) is not None  # on the master, not known to be on its replica
    # the projector's retry folds the batch again from the store, which holds it: nothing of its own
    assert store.apply([]) == []
    assert store.runs(ups[-1].state.status) == [run_id]  # its index written by the retry
    assert store.apply([]) == []  # nothing kept any more
