"""The cluster's index shards and two-step apply on their own, against a scripted client: the shard
keys, the generation fence, and which index writes follow which run writes."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from runlog.projections import RunStatus
from runlog.projections._sharded import LOST, ProjectionLost, ShardedIndexes, lua
from runlog.projections._state import RunState
from runlog.projections.store import ApplyResult, RunUpdate
from runlog.schemas._redis import INDEX_SHARDS, index_shard


class _Pipe:
    def __init__(self, client: _Cluster) -> None:
        self.client, self.calls = client, []

    def execute_command(self, *args: Any) -> None:
        self.calls.append(args)

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        self.client.sent.append(self.calls)
        sha = hashlib.sha1(self.client.index_source.encode()).hexdigest()
        return [1 if c[1] == sha else self.client.answers.pop(0) for c in self.calls]


class _Cluster:
    def __init__(self, held: str | None = "g1") -> None:
        self.held = held
        self.answers: list[int] = []  # the run scripts' answers, in order
        self.sent: list[list[tuple[Any, ...]]] = []
        self.index_source = lua("cluster_index.lua")

    def hget(self, key: str, field: str) -> bytes | None:
        assert (key, field) == ("p:projection", "gen")
        return None if self.held is None else self.held.encode()

    def pipeline(self, transaction: bool = True) -> _Pipe:
        return _Pipe(self)


class _Namespace:
    def __init__(self) -> None:
        self.gen: str | None = "g1"

    @property
    def generation(self) -> str:
        assert self.gen is not None
        return self.gen

    @property
    def marker_key(self) -> str:
        return "p:projection"

    def adopt(self, gen: str | None) -> None:
        self.gen = gen


def _indexes(client: _Cluster) -> tuple[ShardedIndexes, _Namespace]:
    ns = _Namespace()
    return ShardedIndexes(client, "p", ns), ns


def _update(run_id: str, offset: int = 5) -> RunUpdate:
    return RunUpdate(state=RunState(run_id, status=RunStatus.RUNNING, offset=offset))


def _args(updates: list[RunUpdate]) -> list[tuple[list[str], list[str | int]]]:
    return [([f"p:{{{u.run_id}}}:state"], ["g1"]) for u in updates]


def test_each_global_index_is_split_over_the_shards_under_their_own_hash_tags() -> None:
    idx, _ = _indexes(_Cluster())
    keys = idx.status_keys(RunStatus.FAILED)
    assert len(keys) == INDEX_SHARDS and keys[3] == "p:{idx:3}:runs:by_status:FAILED"
    assert idx.shard_status_hash(7) == "p:{idx:7}:runs:status"
    assert idx.effects_key_of("dk-1") == f"p:{{idx:{index_shard('dk-1')}}}:effects:by_key"


def test_an_apply_under_a_generation_the_marker_no_longer_holds_is_refused_before_any_write() -> None:
    client = _Cluster(held="g2")
    idx, ns = _indexes(client)
    with pytest.raises(ProjectionLost, match="no longer holds generation g1"):
        idx.apply([_update("r1")], _args([_update("r1")]))
    assert client.sent == [] and ns.gen is None  # the store looks the marker up again


def test_a_run_state_lost_on_its_node_voids_the_generation() -> None:
    client = _Cluster()
    client.answers = [1, LOST]
    idx, ns = _indexes(client)
    ups = [_update("r1"), _update("r2")]
    with pytest.raises(ProjectionLost, match="1 of 2 updates refused"):
        idx.apply(ups, _args(ups))
    assert ns.gen is None and len(client.sent) == 1  # no index step


def test_applied_and_already_applied_runs_are_indexed_on_their_shard_and_conflicts_are_not() -> None:
    client = _Cluster()
    client.answers = [1, 0, -1]
    idx, ns = _indexes(client)
    ups = [_update("r1"), _update("r2"), _update("r3")]
    assert idx.apply(ups, _args(ups)) == [ApplyResult.APPLIED, ApplyResult.ALREADY, ApplyResult.CONFLICT]
    runs, index = client.sent
    assert len(runs) == 3 and ns.gen == "g1"
    indexed = [(c[3], c[3 + c[2] + 1]) for c in index]  # (first key, run id) of each index call
    assert indexed == [(idx.shard_status_hash(index_shard("r1")), "r1"),
                       (idx.shard_status_hash(index_shard("r2")), "r2")]
