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
