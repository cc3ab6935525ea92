"""A redelivered batch whose runs the store holds already still rewrites their index entries
(``runlog.projections.batch._refreshes``): on Redis Cluster a projector that died between an apply's two
steps (the run's slot, then the index shards) left the state stored and the indexes not, and the
fold of the redelivery finds only duplicates."""

from __future__ import annotations

from collections.abc import Sequence

from runlog.projections import BatchProjector, MemoryStore
from runlog.projections.store import ApplyResult, RunUpdate

from .runlogs import full_run
from .store_contract import CODEC, records


class Recording(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[RunUpdate]] = []

    def apply(self, updates: Sequence[RunUpdate]) -> list[ApplyResult]:
        self.batches.append(list(updates))
        return super().apply(updates)


def test_a_redelivered_batch_sends_the_stored_state_and_its_effects_again_for_the_indexes() -> None:
    recs = records(full_run("r1"))
    store = Recording()
    first = BatchProjector(store, CODEC).process(recs)
    assert first.applied == len(recs) and first.effects
    stored = store.load_state("r1")
    assert stored is not None and stored.closed_effects
    again = BatchProjector(store, CODEC).process(recs)  # a new projector: states from the store
    assert again.applied == 0 and again.outcomes["duplicate"] == len(recs)
    assert again.checkpoints == [] and again.effects == []  # nothing published twice
    (refresh,) = store.batches[-1]
    assert refresh.state == stored and refresh.base_offset == stored.offset
    assert refresh.checkpoints == ()
    assert {e.delivery_key for e in refresh.effects} == \
        {*stored.closed_effects, *stored.open_effects}
    assert store.load_state("r1") == stored  # ALREADY: the state is not written again


def test_runs_this_projector_applied_itself_are_not_refreshed() -> None:
    recs = records(full_run("r2", stages=2))
    store = Recording()
    projector = BatchProjector(store, CODEC)
    projector.process(recs)
    projector.process(recs)  # its cache holds the state it applied, indexes included
    assert store.batches[-1] == []


def test_a_batch_with_new_events_writes_no_refresh_for_that_run() -> None:
    events = full_run("r3", stages=3)
    recs = records(events)
    store = Recording()
    BatchProjector(store, CODEC).process(recs[:5])
    BatchProjector(store, CODEC).process(recs)  # redelivers 5, then new ones
    (update,) = store.batches[-1]
    assert update.state.offset == recs[-1].offset
