"""``effects:by_key`` in real Redis: when runs share a delivery key, the winner is the same whatever
order the runs' updates are applied in ("done beats open, then the earliest opened")."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator

import pytest
import redis

from runlog.projections import RedisStore, RunUpdate, StoredCheckpoint, fold
from runlog.schemas import EffectStatus, ErrorInfo, EventType, ReplayPolicy, RunEvent, Settings
from tests.unit.projections.runlogs import T0

pytestmark = pytest.mark.integration

DK = "d" * 64


def run(run_id: str, opened: int, *steps: tuple[EventType, int]) -> list[RunEvent]:
    """A run that opens an effect on ``DK`` at ``T0 + opened`` and moves it at each step's time."""
    evs = [RunEvent(run_id, 1, 1, EventType.RUN_STARTED, T0),
           RunEvent(run_id, 2, 1, EventType.EFFECT_INTENT, T0 + opened, stage="publish",
                    call_id="publish/cms/0", tool="cms", delivery_key=DK, target="cms:articles",
                    replay_policy=ReplayPolicy.RECONCILE_FIRST)]
    for t, at in steps:
        kw: dict[str, object] = {"stage": "publish", "call_id": "publish/cms/0", "delivery_key": DK}
        if t is EventType.EFFECT_RESULT:
            kw["external_id"] = f"ext-{run_id}"
        if t is EventType.FAILED:
            kw["error"] = ErrorInfo("tool", "timeout", True)
        evs.append(RunEvent(run_id, len(evs) + 1, 1, t, T0 + at, **kw))  # type: ignore[arg-type]
    return evs


def updates(events: list[RunEvent], partition: int) -> list[RunUpdate]:
    """One update per event, chained on the stored offset, as a per-event projector writes them."""
    out, state = [], None
    for i, ev in enumerate(events):
        base = state
        state, o = fold(state, ev, (partition, i))
        cps = (StoredCheckpoint(o.checkpoint, state),) if o.checkpoint else ()
        base_off, base_status = (base.offset, base.status) if base else (-1, None)
        out.append(RunUpdate(state, base_off, base_status, cps, o.effects))
    return out


def interleavings(seqs: list[list[RunUpdate]]) -> Iterator[list[RunUpdate]]:
    """Every merge of the runs' update sequences that keeps each run's own order."""
    if not any(seqs):
        yield []
        return
    for i, s in enumerate(seqs):
        if s:
            for rest in interleavings([*seqs[:i], s[1:], *seqs[i + 1:]]):
                yield [s[0], *rest]


SCENARIOS = {
    # A opened first, then failed; B still has an open intent: both rank "open", A opened earlier
    "a_intent_failed_vs_b_intent": (
        [run("run-a", 10, (EventType.FAILED, 40)), run("run-b", 20)], "run-a", EffectStatus.FAILED),
    # the same, but B opened first
    "b_opened_first_vs_a_failed": (
        [run("run-a", 30, (EventType.FAILED, 40)), run("run-b", 20)], "run-b", EffectStatus.INTENT),
    # both done: the one opened earlier wins, although it finished later
    "a_done_vs_b_done": (
        [run("run-a", 10, (EventType.EFFECT_RESULT, 90)), run("run-b", 20, (EventType.EFFECT_RESULT, 30))],
        "run-a", EffectStatus.DONE),
    # done beats open, even an intent opened earlier
    "a_open_vs_b_done": (
        [run("run-a", 10), run("run-b", 20, (EventType.EFFECT_RESULT, 30))], "run-b", EffectStatus.DONE),
    # three runs: one failed, one reconciled late, one open
    "three_runs": (
        [run("run-a", 5, (EventType.FAILED, 6)),
         run("run-b", 50, (EventType.EFFECT_RECONCILED, 60)),
         run("run-c", 20)], "run-b", EffectStatus.RECONCILED),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_indexed_winner_does_not_depend_on_the_order_of_runs(
    name: str, settings: Settings, redis_client: redis.Redis
) -> None:
    runs, winner, status = SCENARIOS[name]
    seqs = [updates(evs, partition=p) for p, evs in enumerate(runs)]
    stored: dict[bytes, list[int]] = {}
    for n, order in enumerate(interleavings(seqs)):
        store = RedisStore(redis_client, f"{settings.redis_prefix}:o{n}")
        for u in order:
            assert [r.value for r in store.apply([u])] == ["applied"]
        raw = redis_client.hget(store.effects_index_key, DK)
        assert raw is not None
        stored.setdefault(raw, []).append(n)
        # each run's own ledger is that run's latest entry, whatever the index shows
        for evs, seq in zip(runs, seqs, strict=True):
            assert store.effects(evs[0].run_id)[DK] == seq[-1].state.closed_effects.get(
                DK, seq[-1].state.open_effects.get(DK))
    assert len(stored) == 1, f"{len(stored)} different winners over the orders: {list(stored)}"
    (raw,) = stored
    d = json.loads(raw)
    assert (d["run_id"], d["status"]) == (winner, status.value)
    entry = RedisStore(redis_client, f"{settings.redis_prefix}:o0").effect(DK)
    assert entry is not None and entry.run_id == winner and entry.sort_key == d["sort_key"]


def test_a_whole_batch_per_run_picks_the_same_winner_as_one_event_at_a_time(
    settings: Settings, redis_client: redis.Redis
) -> None:
    """A projector batch writes only a run's last entry per key (intent and failure may never be
    written apart): the winner is the same as when every event is applied on its own."""
    runs, winner, status = SCENARIOS["a_intent_failed_vs_b_intent"]
    for n, order in enumerate(itertools.permutations(range(len(runs)))):
        store = RedisStore(redis_client, f"{settings.redis_prefix}:b{n}")
        for p in order:
            last = updates(runs[p], partition=p)[-1]
            state = last.state
            entry = state.closed_effects.get(DK) or state.open_effects[DK]
            store.apply([RunUpdate(state, -1, None, (), (entry,))])
        got = store.effect(DK)
        assert got is not None and (got.run_id, got.status) == (winner, status)


def test_an_indexed_value_written_before_sort_keys_is_replaced(
    settings: Settings, redis_client: redis.Redis
) -> None:
    store = RedisStore(redis_client, settings.redis_prefix)
    redis_client.hset(store.effects_index_key, DK, json.dumps(
        {"delivery_key": DK, "run_id": "old-run", "target": "cms:articles", "status": "DONE", "seq": 3,
         "updated_at": T0}))
    assert store.effect(DK) is not None and store.effect(DK).opened_at is None  # type: ignore[union-attr]
    for u in updates(run("run-a", 10), partition=0):
        store.apply([u])
    got = store.effect(DK)
    assert got is not None and got.run_id == "run-a" and got.opened_at == T0 + 10
