"""The run state's canonical JSON, put together in parts (calls, the recent window) for speed, is
exactly ``json.dumps`` of its plain dict."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

import pytest

from runlog.processors.bench._events import history
from runlog.projections import RunState, _state, fold, fold_all
from runlog.projections._state import evolve_state, state_to_dict, state_to_json, state_to_json_but_calls
from runlog.schemas import RunEvent


def _dumps(d: dict[str, object]) -> str:
    return json.dumps(d, separators=(",", ":"), sort_keys=True)


@pytest.mark.parametrize("events", [1, 2, 65, 130, 301])
def test_texts_are_json_dumps_of_the_plain_state(events: int) -> None:
    st = fold_all(history("run-text", 1, events))
    assert st is not None and (events == 1 or st.recent)
    assert state_to_json(st) == _dumps(state_to_dict(st))
    assert state_to_json_but_calls(st) == _dumps({**state_to_dict(st), "calls": []})


def test_a_window_digest_needing_escapes_and_user_texts_that_look_like_the_window() -> None:
    st = fold_all(history("run-esc", 1, 3))
    assert st is not None
    odd = evolve_state(st, recent=((1, 'quo"te\\ \x00 é'), (2, "d2")),
                       labels={"recent": '"recent":[[1,"x"]]', "\x00recent\x00": "\x00recent\x00"})
    assert state_to_json(odd) == _dumps(state_to_dict(odd))
    assert json.loads(state_to_json(odd))["labels"] == odd.labels


def test_the_pair_cache_across_generations(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_state._PAIR_TEXTS, "size", 8)  # a generation turns over every 8 new pairs
    states = list(_fold_each(history("run-gen", 1, 200)))
    for st in states[::7]:
        assert state_to_json(st) == _dumps(state_to_dict(st))
    assert len(_state._PAIR_TEXTS.current) <= 8


def _fold_each(events: Iterable[RunEvent]) -> Iterator[RunState]:
    """Each state as the events are folded one by one."""
    st: RunState | None = None
    for i, ev in enumerate(events):
        st, _ = fold(st, ev, (0, i))
        assert st is not None
        yield st



def _field_caches() -> list[_state._RunFieldTexts]:
    return [fn.__self__ for name, fn in _state._rest_text.__globals__.items() if name.startswith("_text")]


def test_the_field_text_caches_across_generations(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each field's text is kept per run while the run's field holds the same value
    (``_state._rest_writer``): with a generation turning over every 4 runs, states of many runs, each
    written twice, in turn."""
    caches = _field_caches()
    assert len(caches) > 10  # one per field that is no scalar: workflow, checkpoint, usage, labels...
    for cache in caches:  # emptied: what earlier tests of this process cached is not this test's
        monkeypatch.setattr(cache, "size", 4)
        monkeypatch.setattr(cache, "current", {})
        monkeypatch.setattr(cache, "old", {})
    states = [fold_all(history(f"run-f{i}", 1, 1 + 37 * i)) for i in range(1, 12)]
    for st in [*states, *states[::-1]]:
        assert st is not None
        assert state_to_json(st) == _dumps(state_to_dict(st))
        changed = evolve_state(st, labels={"queue": "q"}, last_error=None, epoch=st.epoch + 1)
        assert state_to_json(changed) == _dumps(state_to_dict(changed))
    assert all(len(c.current) <= 4 for c in caches)


@pytest.mark.parametrize("every", [1, 2, 3, 5, 7])
def test_a_window_made_from_the_last_one_written(every: int) -> None:
    """``_state._recent_text`` makes a run's window from the window written at its last update (the
    oldest pairs cut, the new ones added) when at most ``_WINDOW_BACK`` pairs came since, else from
    each pair: written every ``every`` events, two runs interleaved, and windows that are no slide."""
    a = list(_fold_each(history("run-wa", 1, 150)))
    b = list(_fold_each(history("run-wb", 1, 150)))
    for sa, sb in list(zip(a, b, strict=True))[::every]:
        for st in (sa, sb):
            assert state_to_json(st) == _dumps(state_to_dict(st))
    last = a[-1]
    for odd in (last.recent[:10], last.recent[5:], last.recent[:1], (), last.recent[::2],
                (*last.recent[:-1], (last.recent[-1][0], "other digest"))):
        st = evolve_state(last, recent=odd)
        assert state_to_json(st) == _dumps(state_to_dict(st))


def test_a_run_keeps_one_text_per_field_and_no_long_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A field whose value grows over a run (its closed effects, its children) is kept in its latest
    version only, and a text over ``_FIELD_TEXT_MAX`` is not kept at all: kept in every version, one
    run with 1,500 effects held 449 MiB of texts."""
    caches = _field_caches()
    for cache in caches:
        monkeypatch.setattr(cache, "current", {})
        monkeypatch.setattr(cache, "old", {})
    st = fold_all(history("run-grow", 1, 5))
    assert st is not None
    for n in range(1, 60):
        st = evolve_state(st, children=tuple(f"run-child-{k:04d}" for k in range(n)))
        assert state_to_json(st) == _dumps(state_to_dict(st))
    assert all(len(c.current) + len(c.old) <= 1 for c in caches)  # the one run, each field once
    long = evolve_state(st, children=tuple(f"run-child-{k:05d}" for k in range(_state._FIELD_TEXT_MAX // 10)))
    assert state_to_json(long) == _dumps(state_to_dict(long))
    assert not any(t[0] is long.children for c in caches for t in c.current.values())


def test_a_bool_or_a_float_in_an_int_field_is_written_as_json_writes_it() -> None:
    st = fold_all(history("run-num", 1, 3))
    assert st is not None
    for odd in (evolve_state(st, epoch=True), evolve_state(st, started_at=1.5),
                evolve_state(st, offset=False)):
        assert state_to_json(odd) == _dumps(state_to_dict(odd))
