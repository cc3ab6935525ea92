"""One contract for every ProjectionStore adapter: subclass it once per backend, provide ``store``."""

from __future__ import annotations

from dataclasses import replace

from runlog.projections import (
    ApplyResult,
    BatchProjector,
    OutcomeKind,
    ProjectionStore,
    RawRecord,
    RunStatus,
    RunUpdate,
    StoredCheckpoint,
    fold,
)
from runlog.schemas import Codec, EffectStatus, EventType

from .runlogs import RunBuilder, full_run, zombie

CODEC = Codec()


def records(events: list, partition: int = 2, start: int = 0, topic: str = "t.runlog.events") -> list:
    return [
        RawRecord(topic, partition, start + i, e.run_id.encode(), CODEC.encode(e))
        for i, e in enumerate(events)
    ]


def fold_updates(events: list, partition: int = 2) -> list[RunUpdate]:
    """One update per event, as a per-event projector would write them."""
    out, state = [], None
    for i, ev in enumerate(events):
        base = state
        state, o = fold(state, ev, (partition, i))
        cps = (StoredCheckpoint(o.checkpoint, state),) if o.checkpoint else ()
        base_off, base_status = (base.offset, base.status) if base else (-1, None)
        out.append(RunUpdate(state, base_off, base_status, cps, o.effects,
                             base_calls=base.calls if base else None))
    return out


class StoreContract:
    store: ProjectionStore

    def test_unknown_run(self) -> None:
        assert self.store.load_state("nope") is None
        assert self.store.checkpoints("nope") == []
        assert self.store.effects("nope") == {}
        assert self.store.effect("nope") is None
        assert self.store.load_states(["nope"]) == {}

    def test_apply_per_event_then_read_back(self) -> None:
        evs = full_run("r1", stages=4)
        ups = fold_updates(evs)
        assert self.store.apply(ups) == [ApplyResult.APPLIED] * len(ups)
        final = ups[-1].state
        assert self.store.load_state("r1") == final
        cps = self.store.checkpoints("r1")
        assert [c.checkpoint.stage for c in cps] == ["research", "verify", "draft", "visual"]
        assert all(c.state.last_seq == c.checkpoint.last_seq for c in cps)
        assert cps[-1].state.checkpoint == cps[-1].checkpoint
        led = self.store.effects("r1")
        (dk,) = led
        assert led[dk].status is EffectStatus.DONE and self.store.effect(dk) == led[dk]
        assert self.store.runs(RunStatus.RUNNING) == ["r1"] and self.store.runs() == ["r1"]

    def test_apply_twice_or_older_changes_nothing(self) -> None:
        ups = fold_updates(full_run("r2", stages=2))
        self.store.apply(ups)
        before = self.store.load_state("r2")
        assert self.store.apply(ups) == [ApplyResult.ALREADY] * len(ups)
        assert self.store.apply([ups[3]]) == [ApplyResult.ALREADY]
        assert self.store.load_state("r2") == before
        assert len(self.store.checkpoints("r2")) == 2

    def test_stale_base_is_a_conflict(self) -> None:
        ups = fold_updates(full_run("r3", stages=1))
        self.store.apply(ups[:3])
        skipped = ups[4]  # computed from the state after event 4, the store has 3
        assert self.store.apply([skipped]) == [ApplyResult.CONFLICT]
        assert self.store.load_state("r3") == ups[2].state

    def test_status_index_moves(self) -> None:
        evs = full_run("r4", stages=6)
        self.store.apply(fold_updates(evs))
        assert self.store.runs(RunStatus.COMPLETED) == ["r4"]
        assert self.store.runs(RunStatus.RUNNING) == []

    def test_batches_redelivered_change_nothing_and_count_rejections_once(self) -> None:
        b = RunBuilder("r5").start().stage("research").lease(2).stage("verify")
        evs = list(b.events)
        evs.insert(len(evs) - 2, zombie(evs[3], epoch=1, seq=len(evs)))
        recs = records(evs)
        p1 = BatchProjector(self.store, CODEC)
        r1 = p1.process(recs[:7])
        r2 = p1.process(recs[7:])
        assert r1.applied + r2.applied == len(evs) - 1 and r2.rejected == {"stale_epoch": 1}
        state = self.store.load_state("r5")
        assert state is not None and state.rejected == {"stale_epoch": 1}
        # a restarted projector (cold cache) sees everything again
        p2 = BatchProjector(self.store, CODEC)
        again = p2.process(recs)
        assert again.outcomes == {OutcomeKind.DUPLICATE.value: len(evs)}
        assert again.checkpoints == [] and again.effects == []
        assert self.store.load_state("r5") == state

    def test_stale_cache_refolds_from_the_store(self) -> None:
        evs = full_run("r6", stages=2)
        recs = records(evs)
        a, b = BatchProjector(self.store, CODEC), BatchProjector(self.store, CODEC)
        a.process(recs[:3])
        b.process(recs[:6])  # b took the partition over and went further
        res = a.process(recs[3:])  # a's cache is stale: it must not lose b's work
        assert res.conflicts == 1
        assert res.applied == len(evs) - 6 and res.outcomes[OutcomeKind.DUPLICATE.value] == 3
        final = self.store.load_state("r6")
        expected, _ = None, None
        for i, ev in enumerate(evs):
            expected, _ = fold(expected, ev, (2, i))
        assert final == expected

    def test_dead_letters_and_key_mismatch(self) -> None:
        evs = full_run("r7", stages=1)
        recs = records(evs)
        bad = [
            RawRecord("t", 2, 100, b"r7", b"garbage"),
            RawRecord("t", 2, 101, b"r7", CODEC.encode(evs[0])[:12]),
            RawRecord("t", 2, 102, b"r7", None),
            RawRecord("t", 2, 103, b"other", CODEC.encode(replace(evs[0], type=EventType.UNKNOWN))),
        ]
        res = BatchProjector(self.store, CODEC).process(recs + bad)
        assert [d.reason for d in res.dead_letters] == ["unknown_framing", "truncated", "truncated",
                                                         "key_mismatch"]
        assert res.applied == len(evs)
        s = self.store.load_state("r7")
        assert s is not None and s.last_seq == len(evs) and s.rejected_total == 0
