"""A projector that died between the two steps of a cluster apply (the run's slot written, the
index shards not) leaves a completed run unlisted; the next projector, which folds the redelivered
batch to duplicates, still writes its index entries (``runlog.projections.batch._refreshes``)."""

from __future__ import annotations

from typing import Any

import pytest
import redis

import runlog.projections._sharded as sharded
from runlog.projections import BatchProjector, RedisStore
from runlog.projections._sharded import ProjectionStoreError
from runlog.projections._state import RunStatus
from runlog.schemas import Settings
from tests.unit.projections.runlogs import full_run
from tests.unit.projections.store_contract import CODEC, records

pytestmark = pytest.mark.integration


def test_a_run_stored_without_its_index_entries_is_indexed_by_the_next_projector(
        settings: Settings, redis_client_: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    recs = records(full_run("run-half-applied"))
    dead = RedisStore(redis_client_, settings.redis_prefix, wait_replicas=0)
    real = sharded.eval_each

    def run_step_only(client: Any, source: str, args: Any, after: Any = None) -> list[Any]:
        if dead.indexes is not None and source == dead.indexes.index_source:
            raise redis.ConnectionError("killed between the run's write and the indexes'")
        return real(client, source, args, after)

    monkeypatch.setattr(sharded, "eval_each", run_step_only)
    with pytest.raises(ProjectionStoreError):
        BatchProjector(dead, CODEC).process(recs)
    monkeypatch.setattr(sharded, "eval_each", real)
    stored = dead.load_state("run-half-applied")
    assert stored is not None and stored.status is RunStatus.COMPLETED
    assert dead.runs(RunStatus.COMPLETED) == []  # what the crash left: stored, not indexed
    keys = [*stored.closed_effects, *stored.open_effects]
    assert keys and all(dead.effect(k) is None for k in keys)

    fresh = RedisStore(redis_client_, settings.redis_prefix, wait_replicas=0)  # a new process
    res = BatchProjector(fresh, CODEC).process(recs)
    assert res.applied == 0 and res.effects == []
    assert fresh.runs(RunStatus.COMPLETED) == ["run-half-applied"]
    assert all(fresh.effect(k) == stored.closed_effects.get(k, stored.open_effects.get(k)) for k in keys)
