"""The effect's ``opened_at`` and ``sort_key`` (which run the global ledger shows), and their JSON."""

from __future__ import annotations

import json
from dataclasses import replace

from runlog.projections import EffectEntry, fold_all, state_from_json, state_to_json
from runlog.projections._state import effect_from_dict, effect_to_dict
from runlog.schemas import EffectStatus, ErrorInfo, EventType, RunEvent

from .runlogs import T0, full_run

DK = "k" * 64


def entry(run_id: str, status: EffectStatus, opened_at: int | None, updated_at: int = T0 + 99) -> EffectEntry:
    return EffectEntry(DK, run_id, "cms:articles", status, 3, updated_at, opened_at=opened_at)


def test_done_beats_open_then_the_earliest_then_the_run_id() -> None:
    ranked = [
        entry("b", EffectStatus.DONE, T0 + 1),
        entry("a", EffectStatus.RECONCILED, T0 + 2),
        entry("a", EffectStatus.DONE, T0 + 10),
        entry("c", EffectStatus.FAILED, T0),
        entry("a", EffectStatus.INTENT, T0 + 5),
        entry("b", EffectStatus.INTENT, T0 + 5),
        entry("a", EffectStatus.UNKNOWN, T0 + 1_000_000),
    ]
    keys = [e.sort_key for e in ranked]
    assert keys == sorted(keys)
    assert sorted(k.encode() for k in keys) == [k.encode() for k in keys]  # bytewise, as in Lua
    assert entry("x", EffectStatus.DONE, None, updated_at=T0 + 7).sort_key == f"0:{T0 + 7:015d}:x"
    assert entry("x", EffectStatus.DONE, -5).sort_key == f"0:{0:015d}:x"  # never a "-" sign


def test_opened_at_is_the_first_intent_and_survives_the_result_and_a_retry() -> None:
    evs = full_run("r1", stages=6)
    st = fold_all(evs)
    assert st is not None
    for e in st.closed_effects.values():
        intent = next(ev for ev in evs if ev.delivery_key == e.delivery_key
                      and ev.type is EventType.EFFECT_INTENT)
        assert e.status is EffectStatus.DONE and e.opened_at == intent.occurred_at < e.updated_at
    # intent -> failed -> intent again (a retry of the same call): the key never gets worse
    base = [RunEvent("r2", 1, 1, EventType.RUN_STARTED, T0)]
    kw = {"stage": "publish", "call_id": "publish/0", "delivery_key": DK}
    steps = [(EventType.EFFECT_INTENT, {}), (EventType.FAILED, {"error": ErrorInfo("tool", "x", True)}),
             (EventType.EFFECT_INTENT, {}), (EventType.EFFECT_RESULT, {"external_id": "e1"})]
    keys = []
    st2 = None
    for i, (t, extra) in enumerate(steps):
        base.append(RunEvent("r2", i + 2, 1, t, T0 + 10 * (i + 1), **kw, **extra))  # type: ignore[arg-type]
        st2 = fold_all(base)
        assert st2 is not None
        e = st2.open_effects.get(DK) or st2.closed_effects[DK]
        assert e.opened_at == T0 + 10
        keys.append(e.sort_key)
    assert keys == sorted(keys, reverse=True)


def test_effect_json_round_trips_and_old_json_still_loads() -> None:
    e = entry("a", EffectStatus.INTENT, T0 + 4)
    assert effect_from_dict(json.loads(json.dumps(effect_to_dict(e)))) == e
    # the global index stores the sort key too: an extra field is ignored
    assert effect_from_dict({**effect_to_dict(e), "sort_key": e.sort_key}) == e
    old = {k: v for k, v in effect_to_dict(e).items() if k != "opened_at"}
    assert effect_from_dict(old) == replace(e, opened_at=None)
    st = fold_all(full_run("r3", stages=6))
    assert st is not None and st.closed_effects
    assert state_from_json(state_to_json(st)) == st
    d = json.loads(state_to_json(st))
    for e2 in (*d["open_effects"], *d["closed_effects"]):
        del e2["opened_at"]  # state JSON written before the field existed
    legacy = state_from_json(json.dumps(d))
    assert all(x.opened_at is None for x in legacy.closed_effects.values())


def test_an_entry_from_old_json_freezes_its_updated_at_as_opened_at() -> None:
    evs = [RunEvent("r4", 1, 1, EventType.RUN_STARTED, T0),
           RunEvent("r4", 2, 1, EventType.EFFECT_INTENT, T0 + 10, stage="publish", call_id="c",
                    delivery_key=DK)]
    st = fold_all(evs)
    assert st is not None
    legacy = replace(st, open_effects={DK: replace(st.open_effects[DK], opened_at=None)})
    done = fold_all([RunEvent("r4", 3, 1, EventType.EFFECT_RESULT, T0 + 50, stage="publish",
                              call_id="c", delivery_key=DK, external_id="x")], legacy)
    assert done is not None and done.closed_effects[DK].opened_at == T0 + 10
