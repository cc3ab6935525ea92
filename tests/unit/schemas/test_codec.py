"""The codec: both framings, schema evolution both ways, every malformed-input case."""

from __future__ import annotations

import copy
import io
import json
import struct
from collections import Counter
from dataclasses import replace
from typing import Any

import fastavro
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from hypothesis import given, settings
from hypothesis import strategies as st

from runlog.schemas import (
    SINGLE_OBJECT_MAGIC,
    ArtifactRef,
    Checkpoint,
    Codec,
    DecodeError,
    Effect,
    EffectStatus,
    ErrorInfo,
    EventType,
    ReplayPolicy,
    ResumeRequest,
    RuleResult,
    RunEvent,
    StageSpec,
    WorkflowSpec,
    load_schema,
)
from runlog.schemas._codec import _KINDS
from tests.unit.schemas.avro_reference import Refused, read_body


def full_event() -> RunEvent:
    return RunEvent(
        run_id="run-1",
        seq=7,
        epoch=2,
        type=EventType.VERIFIED,
        occurred_at=1_764_000_000_123,
        stage="visual",
        workflow=WorkflowSpec("content", "3", (StageSpec("research", ("topic",), ("n>=3",)),
                                               StageSpec("visual", (), (), False))),
        input_versions={"facts": "v3"},
        payload_ref=ArtifactRef("file:///a", "ab" * 32, 10, "application/json"),
        artifact_refs=(ArtifactRef("file:///b", "cd" * 32, 20),),
        tool="render",
        call_id="visual/render/0",
        replay_policy=ReplayPolicy.RECONCILE_FIRST,
        idempotency_key="ik",
        delivery_key="dk",
        target="platform:articles",
        request_hash="rh",
        external_id="ext-9",
        verification=(RuleResult("image.count == 3", True), RuleResult("x", False, "why")),
        error=ErrorInfo("Boom", "went wrong", True),
        parent_run_id="run-0",
        forked_from_seq=4,
        attributes={"writer": "w1"},
    )


RECORDS: list[Any] = [
    full_event(),
    RunEvent("r", 1, 1, EventType.RUN_STARTED, 5),
    Checkpoint("r:9", "r", 9, 3, 1234, "draft", 99, {"facts": "v3"},
               (ArtifactRef("file:///c", "ef" * 32, 1),), (RuleResult("ok", True),), "visual", "3"),
    Effect("dk", "r", "platform:articles", EffectStatus.DONE, 12, 100, "ext-1", "publish", "publish"),
    ResumeRequest("r", 1000, "lease expired", "sweeper"),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_single_object_round_trip(record: Any) -> None:
    codec = Codec()
    data = codec.encode(record)
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == codec.fingerprint(f"runlog.{type(record).__name__}")
    assert codec.decode(data, type(record)) == record


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_schema_registry_round_trip(record: Any) -> None:
    registry = SchemaRegistryClient.new_client({"url": "mock://codec-test"})
    writer = Codec(registry)
    data = writer.encode(record)
    assert data[0] == 0
    schema_id = struct.unpack(">I", data[1:5])[0]
    assert json.loads(registry.get_schema(schema_id).schema_str)["name"] == type(record).__name__
    # a reader that shares only the registry resolves the writer schema by id
    assert Codec(registry).decode(data, type(record)) == record


def test_registry_codec_still_reads_single_object_bytes() -> None:
    registry = SchemaRegistryClient.new_client({"url": "mock://codec-test-2"})
    data = Codec().encode(full_event())
    assert Codec(registry).decode(data, RunEvent) == full_event()


def test_fingerprint_matches_fastavro() -> None:
    from fastavro.schema import fingerprint, to_parsing_canonical_form

    for name in ("runlog.RunEvent", "runlog.Checkpoint", "runlog.Effect", "runlog.ResumeRequest"):
        canonical = to_parsing_canonical_form(load_schema(name))
        assert Codec().fingerprint(name).hex() == fingerprint(canonical, "CRC-64-AVRO")


# -- evolution ----------------------------------------------------------------------------------


def v2_schema() -> dict[str, Any]:
    """RunEvent v2: one added field with a default and one added enum symbol."""
    s = copy.deepcopy(load_schema("runlog.RunEvent"))
    s["fields"].append({"name": "cost_cents", "type": "long", "default": 0})
    for f in s["fields"]:
        if f["name"] == "type":
            f["type"]["symbols"].append("RUN_PAUSED")
    return s


def encode_with(schema: dict[str, Any], record: dict[str, Any], codec: Codec) -> bytes:
    fp = codec.add_writer_schema(schema)
    buf = io.BytesIO()
    buf.write(b"\xc3\x01" + fp)
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), record)
    return buf.getvalue()


def base_dict(event_type: str) -> dict[str, Any]:
    return {"run_id": "r", "seq": 3, "epoch": 1, "type": event_type, "occurred_at": 10,
            "stage": "draft"}


def test_v1_reader_reads_v2_data_with_new_field_and_new_symbol() -> None:
    v1 = Codec()
    known = encode_with(v2_schema(), {**base_dict("VERIFIED"), "cost_cents": 42}, v1)
    ev = v1.decode(known, RunEvent)
    assert (ev.type, ev.seq, ev.stage) == (EventType.VERIFIED, 3, "draft")
    newer = encode_with(v2_schema(), {**base_dict("RUN_PAUSED"), "cost_cents": 1}, v1)
    assert v1.decode(newer, RunEvent).type is EventType.UNKNOWN  # enum default


def test_v2_reader_reads_v1_data_filling_defaults() -> None:
    v2 = v2_schema()
    data = Codec().encode(RunEvent("r", 3, 1, EventType.TOOL_CALLED, 10, tool="search"))
    record = fastavro.schemaless_reader(io.BytesIO(data[10:]),
                                        fastavro.parse_schema(load_schema("runlog.RunEvent")),
                                        fastavro.parse_schema(v2))
    assert record["cost_cents"] == 0
    assert record["type"] == "TOOL_CALLED" and record["tool"] == "search"


def test_resume_requests_written_before_seen_epoch_still_decode() -> None:
    from fastavro.schema import fingerprint, to_parsing_canonical_form

    from runlog.schemas import load_past_schemas

    v1 = load_past_schemas("runlog.ResumeRequest")[0]
    assert "seen_epoch" not in {f["name"] for f in v1["fields"]}
    fp = bytes.fromhex(fingerprint(to_parsing_canonical_form(v1), "CRC-64-AVRO"))
    buf = io.BytesIO()
    buf.write(b"\xc3\x01" + fp)
    fastavro.schemaless_writer(buf, fastavro.parse_schema(v1),
                               {"run_id": "r", "reason": "old", "requested_by": "cli", "requested_at": 5})
    codec = Codec()  # knows the earlier version without being told
    assert codec.decode(buf.getvalue(), ResumeRequest) == ResumeRequest("r", 5, "old", "cli", None)
    new = ResumeRequest("r", 6, "now", "cli", seen_epoch=3)
    assert codec.decode(codec.encode(new), ResumeRequest) == new
    # a reader of the earlier version reads a new request, without the epoch
    body = codec.encode(new)[10:]
    current = fastavro.parse_schema(load_schema("runlog.ResumeRequest"))
    old = fastavro.schemaless_reader(io.BytesIO(body), current, fastavro.parse_schema(v1))
    assert set(old) == {"run_id", "reason", "requested_by", "requested_at"}
    assert (old["run_id"], old["reason"], old["requested_by"]) == ("r", "now", "cli")


def test_unknown_fingerprint_until_schema_is_added() -> None:
    codec = Codec()
    other = Codec()
    data = encode_with(v2_schema(), {**base_dict("VERIFIED"), "cost_cents": 1}, other)
    with pytest.raises(DecodeError) as err:
        codec.decode(data, RunEvent)
    assert err.value.reason == "unknown_schema"
    codec.add_writer_schema(v2_schema())
    assert codec.decode(data, RunEvent).seq == 3


# -- malformed input ----------------------------------------------------------------------------


GOOD = Codec().encode(full_event())


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "unknown_framing"),
        (b"hello world", "unknown_framing"),
        (b"\x7b\x22json\x22: 1}", "unknown_framing"),
        (b"\xc3\x01\x00\x01", "truncated"),
        (b"\xc3\x01" + b"\x00" * 8 + b"\x02", "unknown_schema"),
        (GOOD[:-3], "truncated"),
        (GOOD[:12], "truncated"),
        (GOOD + b"\x00\x00", "invalid_body"),
        (b"\x00\x00\x00", "truncated"),
        (b"\x00\x00\x00\x00\x07abc", "unknown_schema"),
    ],
    ids=["empty", "text", "json", "short-header", "unknown-fp", "cut-body", "cut-early",
         "trailing", "short-registry-header", "registry-id-without-registry"],
)
def test_malformed_input_raises_typed_error(data: bytes, reason: str) -> None:
    with pytest.raises(DecodeError) as err:
        Codec().decode(data, RunEvent)
    assert err.value.reason == reason, err.value


def test_invalid_enum_index_is_invalid_body() -> None:
    # type enum index 99 is outside the symbols: zigzag(99) = 198 = varint c6 01
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(load_schema("runlog.RunEvent")),
                               {**base_dict("VERIFIED")})
    raw = bytearray(body.getvalue())
    # run_id "r" (02 72), seq 3 (06), epoch 1 (02), then the enum index
    assert raw[:4] == b"\x02r\x06\x02"
    bad = bytes(raw[:4]) + b"\xc6\x01" + bytes(raw[5:])
    data = b"\xc3\x01" + Codec().fingerprint("runlog.RunEvent") + bad
    with pytest.raises(DecodeError) as err:
        Codec().decode(data, RunEvent)
    assert err.value.reason == "invalid_body"


def test_wrong_record_type() -> None:
    data = Codec().encode(ResumeRequest("r", 1))
    with pytest.raises(DecodeError) as err:
        Codec().decode(data, RunEvent)
    assert err.value.reason == "wrong_type"


def test_unknown_registry_id() -> None:
    registry = SchemaRegistryClient.new_client({"url": "mock://codec-test-3"})
    with pytest.raises(DecodeError) as err:
        Codec(registry).decode(b"\x00\x00\x00\x30\x39\x02", RunEvent)
    assert err.value.reason == "unknown_schema"


def test_oversized_records_refused_both_ways() -> None:
    codec = Codec(max_record_bytes=200)
    big = RunEvent("r", 1, 1, EventType.RUN_STARTED, 1, attributes={"x": "y" * 500})
    with pytest.raises(DecodeError) as err:
        codec.encode(big)
    assert err.value.reason == "oversized"
    with pytest.raises(DecodeError) as err:
        codec.decode(Codec().encode(big), RunEvent)
    assert err.value.reason == "oversized"


RUN_EVENT_SCHEMA = load_schema("runlog.RunEvent")
FUZZ_CODEC = Codec()
HEADER = SINGLE_OBJECT_MAGIC + FUZZ_CODEC.fingerprint("runlog.RunEvent")


def expected_header_reason(data: bytes) -> str | None:
    """What the framing alone makes of ``data`` (None: a RunEvent body follows at byte 10)."""
    if data[:2] == SINGLE_OBJECT_MAGIC:
        if len(data) < 10:
            return "truncated"
        return None if data[2:10] == HEADER[2:] else "unknown_schema"  # no other schema within 2**-61
    if data[:1] == b"\x00":
        return "truncated" if len(data) < 5 else "unknown_schema"  # a registry id, no registry
    return "unknown_framing"


def check_decode(data: bytes, original: RunEvent | None = None) -> str:
    """Decode ``data`` and check the codec's answer against the framing and an independent reader of
    the body (``tests.unit.schemas.avro_reference``), whichever way it goes; returns the outcome.

    A decoded event must be exactly what the body says: the reference reads the same value, and when
    the body is in canonical form the event re-encodes to ``data`` byte for byte. A refusal must name
    a reason, and the reference must refuse the body too (valid bytes are never refused)."""
    codec = FUZZ_CODEC
    head = expected_header_reason(data)
    try:
        event = codec.decode(data, RunEvent)
    except DecodeError as err:
        assert err.reason in DecodeError.REASONS, err
        if head is not None:
            assert err.reason == head, (err, data[:10].hex())
            return err.reason
        with pytest.raises(Refused):
            read_body(RUN_EVENT_SCHEMA, data[10:])  # the codec refused a valid body
        return err.reason
    assert head is None, f"decoded bytes whose framing is {head}: {data[:10].hex()}"
    try:
        ref = read_body(RUN_EVENT_SCHEMA, data[10:])
    except Refused as err:
        pytest.fail(f"the codec decoded a body the specification refuses ({err}): {data.hex()}")
    assert ref.value == _KINDS[RunEvent].to_dict(event), "the codec read another value than the bytes hold"
    if ref.canonical:
        assert codec.encode(event) == data, "a canonical body must be the event's exact encoding"
    if original is not None and data == codec.encode(original):
        assert event == original
    return "decoded" if ref.canonical else "decoded_noncanonical"


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=300),
                 st.binary(max_size=120).map(lambda body: HEADER + body),
                 st.binary(max_size=8).map(lambda b: SINGLE_OBJECT_MAGIC + b)))
def test_random_bytes_decode_to_what_they_hold_or_raise_the_framings_reason(data: bytes) -> None:
    check_decode(data)


SEEDS = [full_event(), RunEvent("r", 3, 1, EventType.STAGE_STARTED, 5, stage="s", prev_hash="ab")]


@st.composite
def mutated(draw: st.DrawFn) -> tuple[bytes, RunEvent]:
    """An encoded event with one to three edits: a byte set, bytes inserted, deleted or appended."""
    original = draw(st.sampled_from(SEEDS))
    data = bytearray(FUZZ_CODEC.encode(original))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["set", "set", "insert", "delete", "append"]))
        pos = draw(st.integers(0, len(data)))
        if kind == "set" and pos < len(data):
            data[pos] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=4))
        elif kind == "delete":
            del data[pos:pos + draw(st.integers(1, 4))]
        else:
            data += draw(st.binary(min_size=1, max_size=8))
    return bytes(data), original


@settings(max_examples=500, deadline=None)
@given(mutated())
def test_mutated_records_decode_to_what_they_hold_or_raise_typed_error(case: tuple[bytes, RunEvent]) -> None:
    check_decode(*case)


def test_every_single_byte_mutation_of_the_type_enum_reads_as_the_bytes_say() -> None:
    """The enum index right after run id, seq and epoch: 0..n-1 read as their symbols; every other
    index, negative ones included (fastavro would count those from the end), is refused."""
    symbols = next(f["type"]["symbols"] for f in RUN_EVENT_SCHEMA["fields"] if f["name"] == "type")
    pos = 10 + 1 + len(b"run-1") + 1 + 1
    assert GOOD[pos] == 2 * symbols.index("VERIFIED")
    outcomes = Counter(check_decode(GOOD[:pos] + bytes([b]) + GOOD[pos + 1:], full_event())
                       for b in range(256))
    n = len(symbols)
    assert outcomes["decoded"] == n and outcomes["decoded_noncanonical"] == 0  # 0..n-1 only
    assert outcomes["invalid_body"] + outcomes["truncated"] == 256 - n


def test_usage_is_a_compatible_addition_of_tool_results() -> None:
    """``RunEvent.usage`` (run_event.avsc) round-trips; an event written before it existed
    (run_event.v4.avsc) reads with no usage; a reader of v4 reads an event with usage, without it."""
    from fastavro.schema import fingerprint, to_parsing_canonical_form

    from runlog.schemas import Usage, load_past_schemas

    v4 = load_past_schemas("runlog.RunEvent")[-1]
    assert "usage" not in {f["name"] for f in v4["fields"]}
    codec = Codec()
    used = RunEvent("r", 3, 1, EventType.TOOL_RESULT, 9, stage="draft", call_id="draft/m/0",
                    usage=Usage("openai:gpt-5.2", 1200, 80, 1000, 0, 2_340_000))
    assert codec.decode(codec.encode(used), RunEvent) == used
    unpriced = replace(used, usage=Usage("local:llama", 5, 6))
    assert codec.decode(codec.encode(unpriced), RunEvent).usage == Usage("local:llama", 5, 6, 0, 0, None)
    # written with v4 (no usage field): read with usage None
    fp = bytes.fromhex(fingerprint(to_parsing_canonical_form(v4), "CRC-64-AVRO"))
    buf = io.BytesIO()
    buf.write(b"\xc3\x01" + fp)
    old_fields = {f["name"] for f in v4["fields"]}
    current = load_schema("runlog.RunEvent")
    as_dict = fastavro.schemaless_reader(io.BytesIO(codec.encode(used)[10:]), fastavro.parse_schema(current))
    fastavro.schemaless_writer(buf, fastavro.parse_schema(v4),
                               {k: v for k, v in as_dict.items() if k in old_fields})
    assert codec.decode(buf.getvalue(), RunEvent) == replace(used, usage=None)
    # a v4 reader reads the new event and skips the usage
    old = fastavro.schemaless_reader(io.BytesIO(codec.encode(used)[10:]), fastavro.parse_schema(current),
                                     fastavro.parse_schema(v4))
    assert "usage" not in old and old["call_id"] == "draft/m/0"
