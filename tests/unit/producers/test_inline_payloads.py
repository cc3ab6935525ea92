"""Small payloads travel inside their events (``RUNLOG_ARTIFACT_INLINE_BYTES``): no artifact written for
them, nothing for a checkpoint to verify elsewhere, recorded results reused from the event itself."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from runlog.producers.calls._artifacts import inline_bytes, is_inline
from runlog.projections import RunStatus
from runlog.projections.fold import fold_all
from runlog.schemas import EventType
from tests.unit.producers.test_runner_memory import World

T = EventType


@pytest.fixture
def world() -> Iterator[World]:
    w = World()
    w.store.inline_max = 512
    yield w
    w.runner.close()


def test_small_arguments_and_results_are_carried_by_their_events(world: World) -> None:
    res = world.runner.run(world.workflow(), {"topic": "kafka"})
    assert res.completed
    evs = world.events(res.run_id)
    calls = [e for e in evs if e.type in (T.TOOL_CALLED, T.TOOL_RESULT)]
    assert len(calls) == 4
    for e in calls:
        assert e.payload_ref is not None and is_inline(e.payload_ref), e
        world.store.verify(e.payload_ref)
    assert inline_bytes(calls[1].payload_ref or calls[0].payload_ref) == b'{"hits":["KAFKA","kafka-2"]}'
    verified = [e for e in evs if e.type is T.VERIFIED]
    assert verified and all(not is_inline(r) for e in verified for r in e.artifact_refs)
    assert world.store._blobs == {}  # nothing went to the store: every payload here is small
    state = fold_all(evs)
    assert state is not None and state.status is RunStatus.COMPLETED


def test_a_payload_over_the_limit_goes_to_the_store_and_is_listed_by_its_checkpoint(world: World) -> None:
    world.store.inline_max = 8
    res = world.runner.run(world.workflow(), {"topic": "kafka"})
    evs = world.events(res.run_id)
    result = next(e for e in evs if e.type is T.TOOL_RESULT)
    assert result.payload_ref is not None and not is_inline(result.payload_ref)
    assert result.payload_ref.sha256 in world.store._blobs
    verified = next(e for e in evs if e.type is T.VERIFIED)
    assert result.payload_ref.sha256 in {r.sha256 for r in verified.artifact_refs}


def test_recorded_inline_results_are_reused_without_calling_tools(world: World) -> None:
    wf = world.workflow()
    first = world.runner.run(wf, {"topic": "kafka"})
    recorded = world.recorded(first.run_id)
    assert all(is_inline(r.result) for r in recorded.values() if r.result is not None)
    res = world.again(first.run_id, wf, {"topic": "kafka"}, recorded_calls=recorded)
    assert res.completed and res.outputs == first.outputs
    assert world.calls == ["search:kafka", "upload:KAFKA"]  # nothing called twice


def test_the_async_runner_carries_them_too(world: World) -> None:
    runner = world.async_runner()

    async def go() -> list[EventType]:
        res = await runner.run(world.workflow(), {"topic": "kafka"})
        assert res.completed
        return [e.type for e in world.events(res.run_id) if e.payload_ref is not None
                and is_inline(e.payload_ref)]

    carried = asyncio.run(go())
    assert carried.count(T.TOOL_CALLED) == 2 and carried.count(T.TOOL_RESULT) == 2
    assert world.store._blobs == {}


def test_runlog_show_names_inline_refs_by_hash_never_by_payload(world: World) -> None:
    """``runlog show --json`` prints the run state's refs: an inline one by media type and hash (the
    payloads, unmasked there, are for ``--payloads``, which masks them)."""
    import json

    from runlog.processors.cli.runs import _state_dict

    res = world.runner.run(world.workflow(), {"topic": "kafka-secret-topic"})
    state = fold_all(world.events(res.run_id))
    assert state is not None
    raw = state.to_json()
    assert "base64," in raw  # the state itself holds the inline refs as they are
    doc = _state_dict(state)
    text = json.dumps(doc)
    assert "base64," not in text
    out = state.stage_outputs["research"]
    assert doc["stage_outputs"]["research"] == [f"data:{out.media_type};sha256={out.sha256}", out.sha256,
                                                out.size, out.media_type]
