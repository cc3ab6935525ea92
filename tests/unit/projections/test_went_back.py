"""A store that went back (a run's stored state older than one the projector applied there: a
failover lost acknowledged writes) is reported, not folded onto: the projector then rebuilds the
namespace from the log instead of leaving the run behind for good."""

from __future__ import annotations

import pytest

from runlog.projections import BatchProjector, MemoryStore, fold
from runlog.projections.store import StoreWentBack

from .runlogs import full_run
from .store_contract import CODEC, records


def test_a_run_older_in_the_store_than_applied_raises_went_back() -> None:
    evs = full_run("r1", stages=3)
    recs = records(evs)
    store = MemoryStore()
    p = BatchProjector(store, CODEC)
    p.process(recs[:6])
    older = None
    for i, ev in enumerate(evs[:3]):
        older, _ = fold(older, ev, (2, i))
    assert older is not None
    store._states["r1"] = older  # what a replica promoted before it received the last writes holds
    with pytest.raises(StoreWentBack) as err:
        p.process(recs[6:])
    assert err.value.run_ids == ("r1",)


def test_another_writer_ahead_is_a_conflict_not_went_back() -> None:
    evs = full_run("r2", stages=2)
    recs = records(evs)
    store = MemoryStore()
    a, b = BatchProjector(store, CODEC), BatchProjector(store, CODEC)
    a.process(recs[:3])
    b.process(recs[:6])
    res = a.process(recs[3:])  # stale cache, store ahead: re-fold, no error
    assert res.conflicts == 1
