"""The projector publishes a batch's checkpoints and effects before the store applies it: a crash
after the apply cannot lose them (a redelivered batch folds to duplicates and publishes nothing),
and a crash before it publishes them again, identical."""

from __future__ import annotations

import pytest

from runlog.projections import BatchProjector, MemoryStore
from runlog.projections._state import EffectEntry
from runlog.schemas import Checkpoint

from .runlogs import full_run
from .store_contract import CODEC, records


def test_outputs_are_published_before_the_store_holds_the_update() -> None:
    recs = records(full_run("r1", stages=3))
    store = MemoryStore()
    seen: list[tuple[int, int, int]] = []

    def publish(cps: list[Checkpoint], effs: list[EffectEntry]) -> None:
        stored = store.load_state("r1")
        seen.append((len(cps), len(effs), -1 if stored is None else stored.offset))

    res = BatchProjector(store, CODEC).process(recs, publish)
    assert seen and sum(c for c, _, _ in seen) == len(res.checkpoints) > 0
    assert sum(e for _, e, _ in seen) == len(res.effects)
    assert all(offset < recs[-1].offset for _, _, offset in seen)  # not applied yet when published


def test_a_crash_while_publishing_leaves_the_store_untouched_and_the_replay_publishes_again() -> None:
    recs = records(full_run("r2", stages=2))
    store = MemoryStore()

    def crash(cps: list[Checkpoint], effs: list[EffectEntry]) -> None:
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        BatchProjector(store, CODEC).process(recs, crash)
    assert store.load_state("r2") is None
    published: list[Checkpoint | EffectEntry] = []
    res = BatchProjector(store, CODEC).process(recs, lambda c, e: published.extend([*c, *e]))
    assert published == [*res.checkpoints, *res.effects] and published
    again: list[object] = []  # redelivered after the apply: duplicates, nothing to publish
    BatchProjector(store, CODEC).process(recs, lambda c, e: again.extend([*c, *e]))
    assert again == []
