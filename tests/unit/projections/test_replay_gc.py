"""A replay folds its chunks with fewer garbage collections, and gives the setting back."""

from __future__ import annotations

import gc

import pytest

from runlog.projections.rebuild import fewer_collections


def test_fewer_collections_puts_the_thresholds_back_even_after_an_error() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), fewer_collections(123_456):
        assert gc.get_threshold()[0] == max(before[0], 123_456)
        raise RuntimeError("fold failed")
    assert gc.get_threshold() == before


def test_nested_replays_raise_it_once_and_the_last_puts_it_back() -> None:
    before = gc.get_threshold()
    with fewer_collections(60_000):
        with fewer_collections(70_000):
            assert gc.get_threshold()[0] == max(before[0], 60_000)
        assert gc.get_threshold()[0] == max(before[0], 60_000), "the inner one put it back too early"
    assert gc.get_threshold() == before


def test_collection_switched_off_is_left_off() -> None:
    before = gc.get_threshold()
    gc.set_threshold(0, *before[1:])
    try:
        with fewer_collections():
            assert gc.get_threshold()[0] == 0
        assert gc.get_threshold()[0] == 0
    finally:
        gc.set_threshold(*before)
