"""The generated reader of ``RunEvent`` objects (``runlog.schemas._avro_object_reader``) against fastavro's
reader followed by the dict mapping (the codec's path before it): the same event for bytes of every
shape (every optional field set or not, each enum symbol, arrays of records, maps, usage); the same
errors on malformed bytes; past schemas through the old path."""

from __future__ import annotations

import io
from typing import Any

import fastavro
import pytest
from hypothesis import given, settings

from runlog.schemas._avro_gen import Unsupported
from runlog.schemas._avro_object_reader import compile_object_decoder
from runlog.schemas._avsc import load_past_schemas, load_schema, writer_for
from runlog.schemas._codec import Codec
from runlog.schemas._mapping import KINDS
from runlog.schemas._types import ArtifactRef, Checkpoint, EventType, ReplayPolicy, RunEvent
from runlog.schemas.errors import DecodeError
from tests.unit.schemas.test_avro_objects import EVENTS, TO_DICT, fastavro_bytes

SCHEMA = writer_for(load_schema("runlog.RunEvent")).parsed
DECODE = compile_object_decoder(SCHEMA, RunEvent)
FROM_DICT = KINDS[RunEvent].from_dict


def old_path(body: bytes) -> RunEvent:
    """fastavro's reader, then the dict mapping: what the codec did before the object reader."""
    record = fastavro.schemaless_reader(io.BytesIO(body), SCHEMA, None)
    assert isinstance(record, dict)
    event: RunEvent = FROM_DICT(record)
    return event


def dict_codec() -> Codec:
    codec = Codec()
    codec._object_readers.clear()  # the codec as it was: the generated dict reader, then the mapping
    return codec


def same(a: Any, b: Any) -> None:
    """Equal, and of the same types all the way down (tuples stay tuples, enums members)."""
    assert a == b
    assert type(a) is type(b)
    if isinstance(a, tuple) and not hasattr(a, "_fields"):
        for x, y in zip(a, b, strict=True):
            same(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            same(a[k], b[k])
    elif hasattr(a, "__dataclass_fields__"):
        for name in a.__dataclass_fields__:
            same(getattr(a, name), getattr(b, name))


@settings(max_examples=400, deadline=None)
@given(EVENTS)
def test_the_object_reader_reads_what_fastavro_and_the_mapping_read(event: RunEvent) -> None:
    body = fastavro_bytes(TO_DICT(event))
    got, end = DECODE(body + b"tail", 0)
    assert end == len(body)
    same(got, old_path(body))
    same(got, event)
    codec = Codec()
    data = codec.encode(event)
    same(codec.decode(data, RunEvent), dict_codec().decode(data, RunEvent))
    got2, body2 = codec.decode_with_body(data, RunEvent)
    assert body2 == body
    same(got2, event)


def test_the_codec_reads_run_events_directly_and_other_records_through_their_dict() -> None:
    assert set(Codec()._object_readers) == {"runlog.RunEvent"}


def test_every_symbol_of_both_enums_reads_as_its_member() -> None:
    for t in EventType:
        for p in (None, *ReplayPolicy):
            event = RunEvent("r", 1, 1, t, 5, replay_policy=p)
            got, _ = DECODE(fastavro_bytes(TO_DICT(event)), 0)
            assert got.type is t and got.replay_policy is p


def test_defaults_read_as_the_dict_path_reads_them() -> None:
    event = RunEvent("r", 1, 1, EventType.STAGE_STARTED, 5)
    got, _ = DECODE(fastavro_bytes(TO_DICT(event)), 0)
    same(got, old_path(fastavro_bytes(TO_DICT(event))))
    assert got.artifact_refs == () and got.attributes == {} and got.usage is None


def malformed() -> list[bytes]:
    event = RunEvent("run", 3, 1, EventType.TOOL_RESULT, 1_700_000_000_000, stage="s", call_id="c",
                     payload_ref=ArtifactRef("file:///a", "h" * 64, 1234), attributes={"k": "v"})
    body = fastavro_bytes(TO_DICT(event))
    out = [body[:n] for n in range(len(body))]  # every truncation
    for i in range(len(body)):  # every single byte changed to a few values
        for v in (0x01, 0x7F, 0xFF, 0x28):
            out.append(body[:i] + bytes([v]) + body[i + 1:])
    return out


def test_malformed_bytes_fail_in_the_codec_with_the_reasons_the_dict_path_gives() -> None:
    new, old = Codec(), dict_codec()
    header = b"\xc3\x01" + new.fingerprint("runlog.RunEvent")
    for body in malformed():
        data = header + body
        try:
            expected: Any = old.decode(data, RunEvent)
        except DecodeError as err:
            with pytest.raises(DecodeError) as got:
                new.decode(data, RunEvent)
            assert got.value.reason == err.reason
            continue
        same(new.decode(data, RunEvent), expected)


def test_past_schemas_still_decode_through_fastavro_and_the_mapping() -> None:
    codec = Codec()
    for past in load_past_schemas("runlog.RunEvent"):
        w = writer_for(past)
        assert w.parsed is not codec._readers["runlog.RunEvent"]
        event = RunEvent("r", 1, 1, EventType.STAGE_STARTED, 5, stage="s")
        record = {k: v for k, v in TO_DICT(event).items() if any(f["name"] == k for f in w.parsed["fields"])}
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, w.parsed, record)
        data = b"\xc3\x01" + w.fingerprint + buf.getvalue()
        got = codec.decode(data, RunEvent)
        assert got == dict_codec().decode(data, RunEvent)
        assert got.run_id == "r" and got.stage == "s"


def test_a_class_that_does_not_match_the_schema_is_unsupported() -> None:
    with pytest.raises(Unsupported):
        compile_object_decoder(SCHEMA, ArtifactRef)
    with pytest.raises(Unsupported):
        compile_object_decoder(writer_for(load_schema("runlog.Checkpoint")).parsed, RunEvent)
    # a Checkpoint reads through its own class: the generator takes any matching dataclass
    decode = compile_object_decoder(writer_for(load_schema("runlog.Checkpoint")).parsed, Checkpoint)
    cp = Checkpoint("c", "r", 3, 0, 9, "s", 7, {"a": "1"}, (ArtifactRef("u", "h", 2),), (), "n", "v")
    got, _ = decode(fastavro_bytes_of("runlog.Checkpoint", KINDS[Checkpoint].to_dict(cp)), 0)
    same(got, cp)


def fastavro_bytes_of(name: str, record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, writer_for(load_schema(name)).parsed, record)
    return buf.getvalue()
