"""The write path's ``RunEvent`` constructor builds what ``RunEvent(...)`` builds, with the same
defaults (a fresh mapping each time) and the same refusal of an unknown field."""

from __future__ import annotations

import dataclasses

import pytest

from runlog.producers.log._new_event import new_event
from runlog.schemas._types import ArtifactRef, ErrorInfo, EventType, ReplayPolicy, RunEvent

BASE = {"run_id": "run-1", "seq": 7, "epoch": 2, "type": EventType.TOOL_RESULT,
        "occurred_at": 1_765_000_000_123}


def test_every_field_given_or_left_to_its_default_builds_the_same_event() -> None:
    full = {**BASE, "stage": "work", "input_versions": {"brief": "v1"},
            "payload_ref": ArtifactRef("file:///a", "ab" * 32, 10, "application/json"), "tool": "search",
            "call_id": "work/search/1", "replay_policy": ReplayPolicy.IDEMPOTENT, "idempotency_key": "k",
            "delivery_key": "d", "target": "t", "request_hash": "h", "external_id": "x",
            "error": ErrorInfo("ValueError", "bad", False), "parent_run_id": "p", "forked_from_seq": 3,
            "attributes": {"writer": "w"}, "prev_hash": "ph", "hash_version": 2}
    assert new_event(**full) == RunEvent(**full)
    for name in full:
        if name not in BASE:
            kw = {k: v for k, v in full.items() if k != name}
            assert new_event(**kw) == RunEvent(**kw), name
    plain = new_event(**BASE)
    assert plain == RunEvent(**BASE) and type(plain) is RunEvent
    assert [getattr(plain, f.name) for f in dataclasses.fields(RunEvent)] == \
        [getattr(RunEvent(**BASE), f.name) for f in dataclasses.fields(RunEvent)]
    assert new_event(**BASE).attributes is not plain.attributes  # a fresh default each time


def test_an_unknown_or_missing_field_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        new_event(**BASE, colour="red")
    with pytest.raises(TypeError):
        new_event(run_id="run-1", seq=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        new_event(**BASE).seq = 8  # type: ignore[misc]
