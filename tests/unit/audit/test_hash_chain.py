"""The hash chain: ``event_hash``, ``prev_hash`` in the schema, ``RunState.last_hash`` from the fold."""

from __future__ import annotations

import dataclasses
import io
import json

import fastavro

from runlog.projections import RunState, fold, fold_all
from runlog.schemas import (
    ArtifactRef,
    Codec,
    EventType,
    RunEvent,
    event_hash,
    load_past_schemas,
    load_schema,
)


def chain(n: int, run_id: str = "r") -> list[RunEvent]:
    out: list[RunEvent] = []
    prev = None
    for seq in range(1, n + 1):
        t = EventType.RUN_STARTED if seq == 1 else EventType.TOOL_CALLED
        ev = RunEvent(run_id, seq, 1, t, 1000 + seq, stage="s", call_id=f"s/t/{seq}", tool="t",
                      prev_hash=prev)
        prev = event_hash(ev)
        out.append(ev)
    return out


def test_event_hash_is_sha256_hex_and_depends_on_every_field() -> None:
    ev = chain(3)[2]
    h = event_hash(ev)
    assert len(h) == 64 and int(h, 16) >= 0
    assert event_hash(dataclasses.replace(ev)) == h
    for change in ({"seq": 4}, {"epoch": 2}, {"occurred_at": 1}, {"stage": "x"}, {"prev_hash": "0" * 64},
                   {"payload_ref": ArtifactRef("file:///a", "a" * 64, 1)}, {"attributes": {"k": "v"}}):
        assert event_hash(dataclasses.replace(ev, **change)) != h, change  # type: ignore[arg-type]


def test_event_hash_ignores_fields_at_their_default() -> None:
    """A field added later with a default leaves the hashes of older events unchanged."""
    ev = RunEvent("r", 1, 1, EventType.RUN_STARTED, 5)
    text = json.dumps({"epoch": 1, "occurred_at": 5, "run_id": "r", "seq": 1, "type": "RUN_STARTED"},
                      separators=(",", ":"), sort_keys=True)
    import hashlib

    assert event_hash(ev) == hashlib.sha256(text.encode()).hexdigest()
    assert event_hash(dataclasses.replace(ev, input_versions={})) == event_hash(ev)


def test_fold_keeps_the_hash_of_the_last_accepted_event() -> None:
    events = chain(5)
    state = fold_all(events)
    assert state is not None and state.last_hash == event_hash(events[-1])
    stale = dataclasses.replace(events[-1], seq=6, epoch=0)
    after, out = fold(state, stale)
    assert out.rejected and after.last_hash == state.last_hash
    assert RunState.from_json(after.to_json()).last_hash == state.last_hash


def test_state_json_without_last_hash_still_loads() -> None:
    state = fold_all(chain(2))
    assert state is not None
    doc = json.loads(state.to_json())
    del doc["last_hash"]
    assert RunState.from_json(json.dumps(doc)).last_hash is None


def test_prev_hash_is_a_compatible_addition() -> None:
    current = load_schema("runlog.RunEvent")
    field = next(f for f in current["fields"] if f["name"] == "prev_hash")
    assert field["type"] == ["null", "string"] and field["default"] is None
    v1 = load_past_schemas("runlog.RunEvent")[0]
    names = [f["name"] for f in current["fields"] if f["name"] not in ("prev_hash", "hash_version", "usage")]
    assert [f["name"] for f in v1["fields"]] == names
    codec = Codec()
    # data written before the field existed (v1 writer) decodes, prev_hash null
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(v1), {
        "run_id": "r", "seq": 2, "epoch": 1, "type": "TOOL_CALLED", "occurred_at": 10})
    fp = codec.add_writer_schema(v1)
    assert Codec().decode(b"\xc3\x01" + fp + buf.getvalue(), RunEvent) == RunEvent(
        "r", 2, 1, EventType.TOOL_CALLED, 10)
    # data written now reads with the v1 schema (forward compatible): the field is dropped
    ev = chain(2)[1]
    data = codec.encode(ev)
    old = fastavro.schemaless_reader(io.BytesIO(data[10:]), fastavro.parse_schema(current),
                                     fastavro.parse_schema(v1))
    assert isinstance(old, dict) and "prev_hash" not in old and old["seq"] == 2
    assert codec.decode(data, RunEvent).prev_hash == ev.prev_hash is not None
