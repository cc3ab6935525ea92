"""The projection's replica waits (``runlog.projections._replicas``) without a cluster: which primaries a
batch waits on and for how many replicas, the ``WAIT`` commands queued after the writes, the
failures that keep the batch from being done, and the store keeping a batch that failed to send it
again with the next (``KeptBatch.apply``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from runlog.projections._kept import KeptBatch
from runlog.projections._replicas import CHECK_EVERY_S, ReplicasBehind, ReplicaWaits, online_replicas
from runlog.projections._sharded import ProjectionLost, ProjectionStoreError
from runlog.projections._state import RunState
from runlog.projections.store import ApplyResult, RunUpdate


class Node:
    def __init__(self, name: str) -> None:
        self.name = name


class NodesManager:
    def __init__(self) -> None:
        self.slots_cache: dict[int, list[Node]] = {}


class Client:
    """A cluster client's routing only: each key's primary is named by the text before its ``:``."""

    def __init__(self) -> None:
        self.nodes = {n: Node(n) for n in ("a", "b", "c")}
        self.nodes_manager = NodesManager()

    def get_node_from_key(self, key: str) -> Node:
        return self.nodes[key.split(":")[0]]


class Pipe:
    def __init__(self) -> None:
        self.queued: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.reinitialize_counter = 0

    def execute_command(self, *args: Any, **kwargs: Any) -> None:
        self.queued.append((args, kwargs))


class Probe:
    """Online replicas per node name, counting the probes."""

    def __init__(self, online: dict[str, int]) -> None:
        self.online = online
        self.calls: list[str] = []

    def __call__(self, node: Any) -> int:
        self.calls.append(node.name)
        return self.online[node.name]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def waits(replicas: int | None = None, online: dict[str, int] | None = None, *, cluster: bool = True,
          clock: Clock | None = None) -> tuple[ReplicaWaits, Probe]:
    probe = Probe(online or {"a": 1, "b": 1, "c": 1})
    return ReplicaWaits(Client(), cluster=cluster, replicas=replicas, timeout_ms=250, probe=probe,
                        clock=clock or Clock()), probe


def test_a_fixed_count_waits_on_each_primary_written_to_once_in_the_order_met() -> None:
    w, probe = waits(2)
    plan = w.plan(["b:{r1}:state", "a:{idx:3}:runs", "b:{r2}:state"])
    assert [(x.name, x.replicas) for x in plan] == [("b", 2), ("a", 2)]
    assert probe.calls == []  # a number is not checked against the replicas there are


def test_zero_never_waits_and_auto_waits_only_on_a_cluster() -> None:
    assert not waits(0)[0].enabled and waits(0)[0].plan(["a:k"]) == []
    assert waits(None)[0].enabled
    standalone, _ = waits(None, cluster=False)
    assert not standalone.enabled and standalone.plan(["a:k"]) == []
    fixed, _ = waits(1, cluster=False)
    assert [(x.name, x.node, x.replicas) for x in fixed.plan(["k1", "k2"])] == [("the Redis server", None, 1)]


def test_auto_waits_for_one_replica_where_one_is_online_and_warns_once_about_a_node_without(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    w, probe = waits(None, {"a": 2, "b": 0, "c": 1}, clock=clock)
    with caplog.at_level(logging.WARNING, logger="runlog.projections._replicas"):
        assert [(x.name, x.replicas) for x in w.plan(["a:k", "b:k", "c:k"])] == [("a", 1), ("c", 1)]
        assert [(x.name, x.replicas) for x in w.plan(["b:k"])] == []
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "node b has no online replica" in warned[0]
    assert probe.calls == ["a", "b", "c"]  # cached: not asked again within CHECK_EVERY_S
    clock.now += CHECK_EVERY_S
    probe.online["b"] = 1  # its replica is back
    assert [(x.name, x.replicas) for x in w.plan(["b:k"])] == [("b", 1)]
    assert probe.calls == ["a", "b", "c", "b"]


def test_the_waits_follow_the_writes_on_their_nodes_and_the_check_returns_the_writes_answers() -> None:
    w, _ = waits(1)
    pipe = Pipe()
    pipe.execute_command("EVALSHA", "sha", 1, "a:k1")
    pipe.execute_command("EVALSHA", "sha", 1, "c:k2")
    check = w.after(pipe, ["a:k1", "c:k2"])
    assert [(args, kw["target_nodes"].name) for args, kw in pipe.queued[2:]] == \
        [(("WAIT", 1, 250), "a"), (("WAIT", 1, 250), "c")]
    assert check([1, 0, 1, 1]) == [1, 0]


def test_the_standalone_wait_has_no_target() -> None:
    w, _ = waits(1, cluster=False)
    pipe = Pipe()
    check = w.after(pipe, ["k"])
    assert pipe.queued == [(("WAIT", 1, 250), {})]
    assert check(["written", 1]) == ["written"]


def test_too_few_replicas_fail_the_batch_naming_the_node_and_the_counts_and_ask_the_node_again() -> None:
    w, probe = waits(None)
    check = w.after(Pipe(), ["a:k", "b:k"])
    with pytest.raises(ReplicasBehind, match="node b was answered by 0 of 1 replicas within 250 ms") as err:
        check([1, 1, 1, 0])
    assert isinstance(err.value, ProjectionStoreError)  # what the projector retries
    w.plan(["a:k", "b:k"])
    assert probe.calls == ["a", "b", "b"]  # b asked again at once, a still cached


def test_a_wait_that_failed_fails_the_batch() -> None:
    w, _ = waits(1)
    check = w.after(Pipe(), ["a:k"])
    with pytest.raises(ReplicasBehind, match=r"Redis node a failed: .*connection refused"):
        check([1, ConnectionError("connection refused")])


@pytest.mark.parametrize("detour", ["commands resent one by one", "slot map reloaded"])
def test_a_pipeline_that_left_its_routing_proves_nothing(detour: str) -> None:
    w, _ = waits(1)
    pipe = Pipe()
    check = w.after(pipe, ["a:k"])
    if detour == "commands resent one by one":
        pipe.reinitialize_counter = 1
    else:
        w.client.nodes_manager.slots_cache = {}
    with pytest.raises(ReplicasBehind, match="slot map changed"):
        check([1, 1])


def test_no_wait_queues_nothing_and_checks_nothing() -> None:
    w, _ = waits(0)
    pipe = Pipe()
    check = w.after(pipe, ["a:k"])
    assert pipe.queued == [] and check([1, 2]) == [1, 2]


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="replicas"):
        ReplicaWaits(Client(), cluster=True, replicas=-1)
    with pytest.raises(ValueError, match="timeout_ms"):
        ReplicaWaits(Client(), cluster=True, timeout_ms=0)


def test_online_replicas_counts_the_replicas_info_lists_online() -> None:
    info = {"role": "master", "connected_slaves": 2, "slave0": {"ip": "h", "port": 1, "state": "online"},
            "slave1": {"ip": "h", "port": 2, "state": "wait_bgsave"}, "slave_read_only": 1}
    assert online_replicas(info) == 1
    assert online_replicas({"role": "master", "connected_slaves": 0}) == 0


# -- a batch that failed is sent again with the next ----------------------------------------------

class Store:
    """A store's kept batch, and the pipeline runs it made."""

    def __init__(self) -> None:
        self.kept = KeptBatch()
        self.sent: list[list[str]] = []
        self.fail: Exception | None = None

    def apply_whole(self, updates: Sequence[RunUpdate],
                    once: Callable[[Sequence[RunUpdate]], list[ApplyResult]]) -> list[ApplyResult]:
        return self.kept.apply(updates, once)

    def once(self, updates: Sequence[RunUpdate]) -> list[ApplyResult]:
        self.sent.append([u.run_id for u in updates])
        if self.fail is not None:
            raise self.fail
        return [ApplyResult.ALREADY if u.run_id.startswith("old") else ApplyResult.APPLIED for u in updates]


def update(run_id: str) -> RunUpdate:
    return RunUpdate(state=RunState(run_id=run_id))


def test_a_batch_that_failed_is_sent_again_ahead_of_the_next_which_gets_its_own_results() -> None:
    s = Store()
    s.fail = ReplicasBehind("too few")
    with pytest.raises(ReplicasBehind):
        s.apply_whole([update("old1"), update("old2")], s.once)
    s.fail = None
    # the projector's retry folds the batch again, finds it stored: no update of its own
    assert s.apply_whole([], s.once) == []
    assert s.apply_whole([update("new")], s.once) == [ApplyResult.APPLIED]
    assert s.sent == [["old1", "old2"], ["old1", "old2"], ["new"]]


def test_a_batch_that_failed_twice_is_kept_once_and_with_the_updates_of_the_failed_retry() -> None:
    s = Store()
    s.fail = ProjectionStoreError("unreachable")
    for batch in ([update("old1")], [update("old2")]):
        with pytest.raises(ProjectionStoreError):
            s.apply_whole(batch, s.once)
    s.fail = None
    assert s.apply_whole([update("new")], s.once) == [ApplyResult.APPLIED]
    assert s.sent[-1] == ["old1", "old2", "new"]


def test_an_update_the_retry_folds_again_is_sent_once_and_both_get_its_result() -> None:
    s = Store()
    s.fail = ProjectionStoreError("unreachable")
    for _ in range(3):  # each retry re-folds the same update (an index-only refresh, say)
        with pytest.raises(ProjectionStoreError):
            s.apply_whole([update("old1")], s.once)
    assert s.sent == [["old1"], ["old1"], ["old1"]]  # kept once, not once per retry
    s.fail = None
    got = s.apply_whole([update("old1"), update("new")], s.once)
    assert got == [ApplyResult.ALREADY, ApplyResult.APPLIED]
    assert s.sent[-1] == ["old1", "new"]


def test_a_lost_namespace_drops_the_kept_batch() -> None:
    s = Store()
    s.fail = ProjectionLost("gone")
    with pytest.raises(ProjectionLost):
        s.apply_whole([update("old1")], s.once)
    s.fail = None
    assert s.apply_whole([], s.once) == []
    assert s.sent == [["old1"]]


# -- the settings ---------------------------------------------------------------------------------

def test_the_settings_read_auto_a_number_and_refuse_the_rest() -> None:
    from runlog.schemas.errors import ConfigError
    from runlog.schemas.settings import Settings

    assert Settings.from_env({}).redis_wait_replicas is None and Settings.from_env({}).redis_wait_ms == 2000
    assert Settings.from_env({"RUNLOG_REDIS_WAIT_REPLICAS": "AUTO"}).redis_wait_replicas is None
    s = Settings.from_env({"RUNLOG_REDIS_WAIT_REPLICAS": "0", "RUNLOG_REDIS_WAIT_MS": "750"})
    assert (s.redis_wait_replicas, s.redis_wait_ms) == (0, 750)
    assert Settings.from_env(s.to_env()) == s and Settings.from_env(Settings().to_env()) == Settings()
    for env in ({"RUNLOG_REDIS_WAIT_REPLICAS": "some"}, {"RUNLOG_REDIS_WAIT_REPLICAS": "-1"},
                {"RUNLOG_REDIS_WAIT_MS": "0"}):
        with pytest.raises(ConfigError, match=next(iter(env))):
            Settings.from_env(env)


def test_the_redis_py_internals_the_detour_check_reads_are_still_there() -> None:
    """``ReplicaWaits._rerouted`` reads two attributes of redis-py's cluster client that are not its
    documented API; an upgrade that renames them would make it see no detour, so this fails then."""
    import inspect

    import redis.cluster

    assert "self.reinitialize_counter = 0" in inspect.getsource(redis.cluster.ClusterPipeline.__init__)
    assert "self._pipe.reinitialize_counter += 1" in inspect.getsource(redis.cluster.PipelineStrategy)
    assert "self.slots_cache = " in inspect.getsource(redis.cluster.NodesManager.initialize)
