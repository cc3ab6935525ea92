"""Property tests: noise (duplicates, zombie writers, interleaving across runs) never changes the facts."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from runlog.projections import OutcomeKind, fold, fold_many
from runlog.schemas import RunEvent

from .runlogs import STAGES, RunBuilder, zombie


@dataclass(frozen=True)
class Noisy:
    log: list[tuple[RunEvent, tuple[int, int]]]
    valid: list[tuple[RunEvent, tuple[int, int]]]
    dup_positions: set[tuple[int, int]]
    zombie_count: dict[str, int]


@st.composite
def noisy_logs(draw: st.DrawFn) -> Noisy:
    n_runs = draw(st.integers(1, 4))
    streams: dict[str, list[tuple[str, RunEvent]]] = {}
    for r in range(n_runs):
        rid = f"run-{r}"
        b = RunBuilder(rid).start()
        lease_after = draw(st.integers(0, 3))
        items: list[tuple[str, RunEvent]] = [("ok", b.events[0])]
        for i, stage in enumerate(STAGES[: draw(st.integers(1, 4))]):
            if i == lease_after:
                before = len(b.events)
                b.lease(2)
                items.append(("ok", b.events[before]))
            before = len(b.events)
            b.stage(stage, draw(st.integers(0, 2)), effect=draw(st.booleans()))
            for ev in b.events[before:]:
                items.append(("ok", ev))
                if draw(st.integers(0, 5)) == 0:  # a writer retry: identical content again
                    items.append(("dup", ev))
                if b.epoch == 2 and draw(st.integers(0, 4)) == 0:  # the zombie still writes
                    seq = b.seq + draw(st.integers(-2, 1))
                    items.append(("zombie", zombie(ev, epoch=1, seq=max(seq, 1))))
        streams[rid] = items
    # interleave runs (each run's order kept), runs hashed onto 2 partitions
    order = draw(st.permutations([rid for rid, its in streams.items() for _ in its]))
    cursors = dict.fromkeys(streams, 0)
    offsets = {0: 0, 1: 0}
    noisy = Noisy([], [], set(), dict.fromkeys(streams, 0))
    for rid in order:
        kind, ev = streams[rid][cursors[rid]]
        cursors[rid] += 1
        part = int(rid.rsplit("-", 1)[1]) % 2
        pos = (part, offsets[part])
        offsets[part] += 1
        noisy.log.append((ev, pos))
        if kind == "ok":
            noisy.valid.append((ev, pos))
        elif kind == "dup":
            noisy.dup_positions.add(pos)
        else:
            noisy.zombie_count[rid] += 1
    return noisy


@settings(max_examples=150, deadline=None)
@given(noisy_logs())
def test_noise_never_changes_the_facts(n: Noisy) -> None:
    noisy = fold_many(n.log)
    clean = fold_many(n.valid)
    assert noisy.keys() == clean.keys()
    for rid, s in noisy.items():
        assert s.without_audit() == clean[rid].without_audit(), rid
        assert s.rejected_total == n.zombie_count[rid]
        assert s.rejected_total == 0 or set(s.rejected) == {"stale_epoch"}


@settings(max_examples=100, deadline=None)
@given(noisy_logs())
def test_every_record_is_classified_as_expected(n: Noisy) -> None:
    states: dict = {}
    valid = {pos for _, pos in n.valid}
    for ev, pos in n.log:
        states[ev.run_id], out = fold(states.get(ev.run_id), ev, pos)
        if pos in valid:
            assert out.kind is OutcomeKind.ACCEPTED
        elif pos in n.dup_positions:
            assert out.kind is OutcomeKind.DUPLICATE
        else:
            assert out.kind is OutcomeKind.REJECTED_FENCED


@settings(max_examples=100, deadline=None)
@given(noisy_logs())
def test_folding_twice_changes_nothing(n: Noisy) -> None:
    once = fold_many(n.log)
    twice = fold_many(n.log, once)
    assert twice == once
    for ev, pos in n.log:
        s, out = fold(once[ev.run_id], ev, pos)
        assert s is once[ev.run_id] and out.kind is OutcomeKind.DUPLICATE
