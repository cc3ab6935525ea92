"""The fold's fast copies compute exactly what ``dataclasses.replace`` computes.

``evolve_state`` / ``evolve_call`` (projections/_state.py) set a new object's slots directly instead
of going through ``__init__``; every fold below is run twice, once as shipped and once with those
copies swapped for ``dataclasses.replace``, and the states, outcomes and JSON texts must be equal.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import random
from collections.abc import Iterator
from typing import Any

import pytest

from runlog.processors.bench._events import history
from runlog.projections import RunState, fold
from runlog.projections._state import (
    CallRecord,
    CallStatus,
    evolve_call,
    evolve_state,
    state_to_dict,
    state_to_json,
)
from runlog.schemas import EventType, RunEvent

from .runlogs import STAGES, RunBuilder, zombie

fold_module = importlib.import_module("runlog.projections.fold")  # ``fold`` there is the function
fold_operators = importlib.import_module("runlog.projections._fold_operators")


def _logs(rng: random.Random) -> Iterator[list[tuple[RunEvent, tuple[int, int] | None]]]:
    yield [(e, (0, i)) for i, e in enumerate(history("bench", 1, 260, cycle=20))]
    for n in range(40):
        b = RunBuilder(f"run-{n}").start()
        for i, stage in enumerate(STAGES[: rng.randint(1, len(STAGES))]):
            if rng.random() < 0.3:
                b.lease(i + 2)
            b.stage(stage, rng.randint(0, 3), effect=rng.random() < 0.5, verify=rng.random() < 0.8)
            if rng.random() < 0.1:
                b.fail(stage)
        if rng.random() < 0.5:
            b.complete()
        events: list[tuple[RunEvent, tuple[int, int] | None]] = [(e, (1, i)) for i, e in enumerate(b.events)]
        noisy = list(events)
        for _ in range(rng.randint(0, 6)):  # duplicates, redeliveries, zombies, gaps
            ev, pos = rng.choice(events)
            k = rng.randint(0, 3)
            if k == 0:
                noisy.insert(rng.randint(0, len(noisy)), (ev, None))
            elif k == 1:
                noisy.insert(rng.randint(0, len(noisy)), (ev, pos))
            elif k == 2:
                z = zombie(ev, 0, ev.seq + 1)
                noisy.insert(rng.randint(0, len(noisy)), (z, (1, 10_000 + len(noisy))))
            else:
                noisy.insert(rng.randint(0, len(noisy)), (dataclasses.replace(ev, seq=ev.seq + 5), None))
        yield noisy
        yield [(e, None) for e in b.events]


def _fold_log(log: list[tuple[RunEvent, tuple[int, int] | None]]) -> list[tuple[RunState, Any]]:
    state: RunState | None = None
    out = []
    for ev, pos in log:
        state, outcome = fold(state, ev, pos)
        out.append((state, outcome))
    return out


def test_fold_with_fast_copies_equals_fold_with_dataclasses_replace(monkeypatch: pytest.MonkeyPatch) -> None:
    logs = list(_logs(random.Random(5)))
    fast = [_fold_log(log) for log in logs]
    monkeypatch.setattr(fold_module, "evolve_state", dataclasses.replace)
    monkeypatch.setattr(fold_operators, "evolve_state", dataclasses.replace)
    monkeypatch.setattr(fold_operators, "evolve_call", dataclasses.replace)
    slow = [_fold_log(log) for log in logs]
    assert fast == slow
    for a, b in zip(fast, slow, strict=True):
        for (sa, _), (sb, _) in zip(a, b, strict=True):
            assert type(sa) is RunState
            assert state_to_json(sa) == state_to_json(sb)


def test_evolve_equals_replace_for_every_field() -> None:
    states = [s for log in _logs(random.Random(9)) for s, _ in _fold_log(log)][::7]
    rng = random.Random(3)
    names = [f.name for f in dataclasses.fields(RunState)]
    for s in states:
        other = rng.choice(states)
        changes = {n: getattr(other, n) for n in rng.sample(names, rng.randint(0, len(names)))}
        got = evolve_state(s, **changes)
        assert got == dataclasses.replace(s, **changes)
        assert state_to_json(got) == state_to_json(dataclasses.replace(s, **changes))
        assert all(getattr(got, n) is (changes[n] if n in changes else getattr(s, n)) for n in names)
    c = CallRecord("c", "t", None, CallStatus.CALLED, "s", 3)
    assert evolve_call(c, status=CallStatus.RESULT) == dataclasses.replace(c, status=CallStatus.RESULT)
    assert hash(evolve_call(c)) == hash(c)


def test_evolve_refuses_unknown_fields_and_keeps_states_frozen() -> None:
    s = RunState("r")
    with pytest.raises(TypeError):
        evolve_state(s, no_such_field=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        evolve_state(s).last_seq = 3  # type: ignore[misc]
    assert evolve_state(s, status=s.status) == s and EventType.RUN_STARTED


def _reference_json(s: RunState) -> str:
    return json.dumps(state_to_dict(s), separators=(",", ":"), sort_keys=True)


def test_state_json_is_the_plain_encoding_of_the_state_dict(monkeypatch: pytest.MonkeyPatch) -> None:
    """The snapshot text (a Redis value) is byte for byte ``json.dumps`` of ``state_to_dict``, with
    the call-text cache warm, cold, rotating, and for calls changed in place of older ones."""
    states = [s for log in _logs(random.Random(11)) for s, _ in _fold_log(log)]
    odd = RunState("r\u00e9", calls={
        k: CallRecord(k, "t\u2028", None, CallStatus.CALLED, None, i, request_hash="\"\\\x01")
        for i, k in enumerate(["b", "a\U0001f600", "", "a"])})
    states += [odd, RunState("empty"), evolve_state(odd, calls={})]
    for s in states + states[::-1]:
        assert state_to_json(s) == _reference_json(s)
        assert RunState.from_json(state_to_json(s)) == s
    state_module = importlib.import_module("runlog.projections._state")
    monkeypatch.setattr(state_module._CALL_TEXTS, "size", 3)
    for s in states:
        assert state_to_json(s) == _reference_json(s)
    changed = {k: evolve_call(c, status=CallStatus.RESULT) for k, c in odd.calls.items()}
    moved = evolve_state(odd, calls=changed)
    assert state_to_json(moved) == _reference_json(moved)
