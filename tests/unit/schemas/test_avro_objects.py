"""The generated writer of ``RunEvent`` objects (``runlog.schemas._avro_objects``) against fastavro and the
codec's dict path: the same bytes for events of every shape (every optional field set or not, each
enum symbol, arrays of records, maps); the same behaviour on values it does not take."""

from __future__ import annotations

import io
from typing import Any

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runlog.schemas._avro_gen import OutOfRange, Unsupported
from runlog.schemas._avro_objects import compile_object_encoder
from runlog.schemas._avsc import load_past_schemas, load_schema, writer_for
from runlog.schemas._codec import Codec
from runlog.schemas._mapping import KINDS
from runlog.schemas._types import (
    ArtifactRef,
    ErrorInfo,
    EventType,
    ReplayPolicy,
    RuleResult,
    RunEvent,
    StageSpec,
    Usage,
    WorkflowSpec,
)

SCHEMA = writer_for(load_schema("runlog.RunEvent")).parsed
ENCODE = compile_object_encoder(SCHEMA, RunEvent)
TO_DICT = KINDS[RunEvent].to_dict

LONGS = st.one_of(st.integers(-300, 300), st.integers(-(1 << 63), (1 << 63) - 1))
INTS = st.one_of(st.integers(-300, 300), st.integers(-(1 << 31), (1 << 31) - 1))
TEXT = st.text(max_size=12)
OPT_TEXT = st.none() | TEXT
SMALL_MAPS = st.dictionaries(TEXT, TEXT, max_size=3)

ARTIFACTS = st.builds(ArtifactRef, TEXT, TEXT, LONGS, TEXT)
NAMES = st.lists(TEXT, max_size=3).map(tuple)
STAGES = st.builds(StageSpec, TEXT, NAMES, NAMES, st.booleans())
WORKFLOWS = st.builds(WorkflowSpec, TEXT, TEXT, st.lists(STAGES, max_size=3).map(tuple))
RULES = st.builds(RuleResult, TEXT, st.booleans(), OPT_TEXT)
ERRORS = st.builds(ErrorInfo, TEXT, TEXT, st.booleans())
USAGES = st.builds(Usage, TEXT, LONGS, LONGS, LONGS, LONGS, st.none() | LONGS)

EVENTS = st.builds(
    RunEvent,
    run_id=TEXT, seq=LONGS, epoch=LONGS, type=st.sampled_from(list(EventType)), occurred_at=LONGS,
    stage=OPT_TEXT, workflow=st.none() | WORKFLOWS, input_versions=SMALL_MAPS,
    payload_ref=st.none() | ARTIFACTS, artifact_refs=st.lists(ARTIFACTS, max_size=3).map(tuple),
    tool=OPT_TEXT, call_id=OPT_TEXT, replay_policy=st.none() | st.sampled_from(list(ReplayPolicy)),
    idempotency_key=OPT_TEXT, delivery_key=OPT_TEXT, target=OPT_TEXT, request_hash=OPT_TEXT,
    external_id=OPT_TEXT, verification=st.lists(RULES, max_size=3).map(tuple), error=st.none() | ERRORS,
    parent_run_id=OPT_TEXT, forked_from_seq=st.none() | LONGS, attributes=SMALL_MAPS, prev_hash=OPT_TEXT,
    hash_version=INTS, usage=st.none() | USAGES,
)


def fastavro_bytes(record: Any) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, SCHEMA, record)
    return buf.getvalue()


def dict_path(codec: Codec, event: RunEvent) -> bytes:
    """What the codec wrote before the direct writer: the event's Avro dict, the generated writer."""
    return codec._encode_dict(KINDS[RunEvent], "runlog.RunEvent", b"", event)


@settings(max_examples=400, deadline=None)
@given(EVENTS)
def test_the_direct_writer_writes_what_fastavro_writes_from_the_events_avro_dict(event: RunEvent) -> None:
    expected = fastavro_bytes(TO_DICT(event))
    assert ENCODE(event) == expected
    codec = Codec()
    data = codec.encode(event)
    assert data[10:] == expected and data[:10] == b"\xc3\x01" + codec.fingerprint("runlog.RunEvent")
    assert dict_path(codec, event) == expected
    assert codec.decode(data, RunEvent) == event


def test_the_codec_writes_run_events_directly_and_other_records_through_their_dict() -> None:
    codec = Codec()
    assert set(codec._objects) == {"runlog.RunEvent"}


def test_every_symbol_of_both_enums_is_written_as_its_index() -> None:
    symbols = SCHEMA["fields"][3]["type"]["symbols"]
    policies = next(f for f in SCHEMA["fields"] if f["name"] == "replay_policy")["type"][1]["symbols"]
    for t in EventType:
        body = ENCODE(RunEvent("r", 1, 1, t, 5))
        assert body == fastavro_bytes(TO_DICT(RunEvent("r", 1, 1, t, 5)))
        assert body[4] == symbols.index(t.value) * 2
    for p in ReplayPolicy:
        event = RunEvent("r", 1, 1, EventType.TOOL_CALLED, 5, replay_policy=p)
        assert ENCODE(event) == fastavro_bytes(TO_DICT(event))
        assert policies.index(p.value) >= 0


@pytest.mark.parametrize("fields", [
    {"artifact_refs": [ArtifactRef("u", "h", 3)]},              # a list, not a tuple
    {"attributes": [("k", "v")]},                               # pairs, not a mapping: dict() takes them
    {"verification": [RuleResult("r", True)], "input_versions": {"a": "1"}},
    {"stage": 7},                                               # not a string: fastavro names it
    {"type": "STAGE_STARTED"},                                  # a plain string, not the enum
    {"seq": 2**63},                                             # outside a long
])
def test_a_value_the_direct_writer_does_not_take_behaves_as_the_dict_path(fields: dict[str, Any]) -> None:
    """Written as the dict path writes it, or refused with the error it raises."""
    base: dict[str, Any] = {"run_id": "r", "seq": 1, "epoch": 1, "type": EventType.STAGE_STARTED,
                            "occurred_at": 5}
    event = RunEvent(**{**base, **fields})
    old = Codec()
    old._objects.clear()  # the codec as it was: every record through its Avro dict
    try:
        expected: bytes | type[BaseException] = old.encode(event)
    except Exception as err:  # noqa: BLE001 - whatever the dict path raises, the direct path must too
        expected = type(err)
    if isinstance(expected, bytes):
        assert Codec().encode(event) == expected
    else:
        with pytest.raises(expected):
            Codec().encode(event)


def test_an_int_outside_32_bits_is_refused_by_the_direct_writer_too() -> None:
    with pytest.raises(OutOfRange):
        ENCODE(RunEvent("r", 1, 1, EventType.STAGE_STARTED, 5, hash_version=2**31))


def test_past_run_event_schemas_compile_or_are_refused_as_unsupported() -> None:
    """A schema the class does not match (an older one, without today's fields) is not taken."""
    for past in load_past_schemas("runlog.RunEvent"):
        parsed = writer_for(past).parsed
        try:
            encode = compile_object_encoder(parsed, RunEvent)
        except Unsupported:
            continue
        event = RunEvent("r", 1, 1, EventType.STAGE_STARTED, 5, stage="s")
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, TO_DICT(event))
        assert encode(event) == buf.getvalue()


def test_a_class_that_does_not_match_the_schema_is_unsupported() -> None:
    with pytest.raises(Unsupported):
        compile_object_encoder(SCHEMA, ArtifactRef)
    with pytest.raises(Unsupported):
        compile_object_encoder(writer_for(load_schema("runlog.Checkpoint")).parsed, RunEvent)
