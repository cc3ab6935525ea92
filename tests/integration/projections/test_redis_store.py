"""The store contract against real Redis, plus what only Redis has: keys, script, indexes."""

from __future__ import annotations

import json

import pytest
import redis

from runlog.projections import ProjectionLost, RedisStore, RunStatus
from runlog.schemas import Settings
from tests.unit.projections.runlogs import full_run
from tests.unit.projections.store_contract import StoreContract, fold_updates

pytestmark = pytest.mark.integration


class TestRedisStore(StoreContract):
    @pytest.fixture(autouse=True)
    def _store(self, settings: Settings, redis_client: redis.Redis) -> None:
        self.store = RedisStore(redis_client, settings.redis_prefix)
        self.redis = redis_client
        self.prefix = settings.redis_prefix

    def test_key_layout(self) -> None:
        self.store.apply(fold_updates(full_run("run-42", stages=4)))
        p = self.prefix
        keys = {k.decode() for k in self.redis.scan_iter(match=f"{p}:*")}
        assert keys == {
            f"{p}:{{run-42}}:state", f"{p}:{{run-42}}:checkpoints", f"{p}:{{run-42}}:effects",
            f"{p}:runs:by_status:RUNNING", f"{p}:effects:by_key", f"{p}:projection",
        }
        h = self.redis.hgetall(f"{p}:{{run-42}}:state")
        assert h[b"status"] == b"RUNNING" and h[b"stage"] == b"" and h[b"next_stage"] == b"prefill"
        assert int(h[b"offset"]) == int(h[b"last_seq"]) - 1 and h[b"workflow_version"] == b"3"
        assert json.loads(h[b"snapshot"])["run_id"] == "run-42"
        assert self.redis.zcard(f"{p}:{{run-42}}:checkpoints") == 4
        (dk,) = self.redis.hkeys(f"{p}:effects:by_key")
        assert json.loads(self.redis.hget(f"{p}:effects:by_key", dk))["run_id"] == "run-42"
        assert self.store.runs(RunStatus.RUNNING) == ["run-42"]

    def test_script_reloaded_after_flush(self) -> None:
        ups = fold_updates(full_run("r-flush", stages=1))
        self.store.apply(ups[:2])
        self.redis.script_flush()
        assert self.store.apply(ups[2:])
        assert self.store.load_state("r-flush") == ups[-1].state

    def _keys(self) -> set[bytes]:
        return set(self.redis.scan_iter(match=f"{self.prefix}:*"))

    def test_an_apply_onto_an_emptied_namespace_is_refused_and_writes_nothing(self) -> None:
        updates = fold_updates(full_run("run-7", stages=3))
        self.store.apply(updates[:5])
        for k in self._keys():  # Redis emptied under the store (a restart without data)
            self.redis.delete(k)
        with pytest.raises(ProjectionLost, match="no longer holds generation"):
            self.store.apply(updates[5:])
        assert self._keys() == set()
        # the store does not keep writing under the lost generation: it claims a new one
        self.store.apply(updates[:1])
        assert self.store.marker() is not None and self.store.load_state("run-7") is not None

    def test_a_rebuild_started_elsewhere_fences_the_other_writers(self) -> None:
        updates = fold_updates(full_run("run-8", stages=3))
        self.store.apply(updates[:3])
        rebuilder = RedisStore(self.redis, self.prefix)
        gen = rebuilder.begin_rebuild("holder-a")
        assert gen is not None and rebuilder.begin_rebuild("holder-b") is None  # one holder at a time
        assert rebuilder.hold_rebuild("holder-a") and not rebuilder.hold_rebuild("holder-b")
        RedisStore(self.redis, self.prefix).abandon_rebuild("holder-b")  # not its lock: kept
        assert rebuilder.rebuild_locked()
        before = self.redis.hgetall(f"{self.prefix}:{{run-8}}:state")
        with pytest.raises(ProjectionLost):
            self.store.apply(updates[3:])
        assert self.redis.hgetall(f"{self.prefix}:{{run-8}}:state") == before
        rebuilder.apply(updates[3:])  # the rebuilder writes under the new generation
        with pytest.raises(ProjectionLost, match="being rebuilt"):
            _ = RedisStore(self.redis, self.prefix).generation  # a newcomer waits for ready
        rebuilder.finish_rebuild("holder-a", gen)
        assert not rebuilder.rebuild_locked()
        m = self.store.marker()
        assert m is not None and m.gen == gen and m.state == "ready"

    def test_invalidate_drops_only_its_own_generation_and_refuses_later_applies(self) -> None:
        updates = fold_updates(full_run("run-inv", stages=2))
        self.store.apply(updates[:3])
        other = RedisStore(self.redis, self.prefix)
        gen = other.generation  # the same namespace, adopted
        assert self.store.invalidate()
        assert self.store.marker() is None
        with pytest.raises(ProjectionLost):  # every writer of the old generation is refused
            other.apply(updates[3:])
        late = RedisStore(self.redis, self.prefix)
        new_gen = late.generation  # a new namespace generation (what a rebuild does)
        assert new_gen != gen
        other.adopt(gen)
        assert not other.invalidate()  # a stale invalidation leaves the new generation alone
        marker = late.marker()
        assert marker is not None and marker.gen == new_gen
