"""The generated Avro writer and reader (``runlog.schemas._avro_gen``) against fastavro: same bytes, same
values, for records of every shape the bundled schemas allow; and the codec's fallbacks."""

from __future__ import annotations

import io
from typing import Any

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runlog.schemas._avro_gen import Unsupported, compile_schema, read_long, write_long
from runlog.schemas._avsc import RECORD_FILES, load_past_schemas, load_schema, writer_for
from runlog.schemas._codec import Codec
from runlog.schemas._types import EventType, RunEvent
from runlog.schemas.errors import DecodeError

PARSED = {name: writer_for(load_schema(name)).parsed for name in RECORD_FILES}
PAST = [writer_for(s).parsed for name in RECORD_FILES for s in load_past_schemas(name)]

LONGS = st.one_of(st.integers(-300, 300), st.integers(-(1 << 63), (1 << 63) - 1))
INTS = st.one_of(st.integers(-300, 300), st.integers(-(1 << 31), (1 << 31) - 1))
TEXT = st.text(max_size=12)


def values(t: Any, names: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Any value of Avro type ``t`` (as fastavro's parsed schema spells it)."""
    if isinstance(t, str):
        prim = {"null": st.none(), "boolean": st.booleans(), "int": INTS, "long": LONGS,
                "string": TEXT, "bytes": st.binary(max_size=8), "double": st.floats(allow_nan=False)}
        return prim[t] if t in prim else values(names[t], names)
    if isinstance(t, list):
        return st.one_of(*(values(b, names) for b in t))
    kind = t["type"]
    if "name" in t:
        names[t["name"]] = t
    if kind == "record":
        return st.fixed_dictionaries({f["name"]: values(f["type"], names) for f in t["fields"]})
    if kind == "enum":
        return st.sampled_from(t["symbols"])
    if kind == "array":
        return st.lists(values(t["items"], names), max_size=3)
    if kind == "map":
        return st.dictionaries(TEXT, values(t["values"], names), max_size=3)
    return values(kind, names)


def fastavro_bytes(schema: Any, record: Any) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, record)
    return buf.getvalue()


@pytest.mark.parametrize("schema", [*PARSED.values(), *PAST], ids=lambda s: s["name"])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_generated_code_writes_and_reads_what_fastavro_does(schema: Any, data: st.DataObject) -> None:
    record = data.draw(values(schema, {}))
    encode, decode = compile_schema(schema)
    expected = fastavro_bytes(schema, record)
    assert encode(record) == expected
    framed = b"head" + expected
    value, end = decode(framed, 4)
    assert end == len(framed)
    assert value == fastavro.schemaless_reader(io.BytesIO(expected), schema, None)


@given(LONGS)
def test_varints_round_trip(n: int) -> None:
    data = write_long(n)
    assert data == fastavro_bytes("long", n)
    first = data[0]
    value, end = (((first >> 1) ^ -(first & 1)), 1) if first < 0x80 else read_long(data, 1, first)
    assert (value, end) == (n, len(data))


def test_recent_varints_are_cached_for_ints_only() -> None:
    from runlog.schemas._avro_gen import _LONGS, _LONGS_KEPT

    ts = 1_767_323_045_678
    assert write_long(ts) == write_long(ts) == fastavro_bytes("long", ts) and _LONGS[ts] == write_long(ts)
    with pytest.raises(TypeError):  # a float equal to a cached int is not served from the cache
        write_long(float(ts))  # type: ignore[arg-type]
    for n in range(1000, 1000 + _LONGS_KEPT + 5):
        assert write_long(n) == fastavro_bytes("long", n)
    assert len(_LONGS) <= _LONGS_KEPT
    with pytest.raises(OverflowError):
        write_long(1 << 63)


def test_an_eleven_byte_varint_and_a_long_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError, match="longer than 10"):
        read_long(b"\xff" * 11, 1, 0xFF)
    with pytest.raises(ValueError, match="outside a long"):
        read_long(b"\xff" * 9 + b"\x7f", 1, 0xFF)  # 70 bits of value


def test_unions_beyond_null_and_one_type_are_unsupported() -> None:
    schema = fastavro.parse_schema({"type": "record", "name": "X", "fields": [
        {"name": "v", "type": ["null", "string", "long"]}]}, named_schemas={})
    with pytest.raises(Unsupported, match="only null and one other type"):
        compile_schema(schema)


def test_the_codec_lets_fastavro_name_a_value_the_generated_writer_does_not_take() -> None:
    codec = Codec()
    bad = RunEvent("r", 1, 1, EventType.STAGE_STARTED, 5, stage=7)  # type: ignore[arg-type]
    with pytest.raises((TypeError, ValueError)) as fast_err:
        codec.encode(bad)
    with pytest.raises(type(fast_err.value)):
        fastavro_bytes(PARSED["runlog.RunEvent"], {**codec_dict(bad)})


def codec_dict(event: RunEvent) -> dict[str, Any]:
    from runlog.schemas._mapping import KINDS

    return KINDS[RunEvent].to_dict(event)


@pytest.mark.parametrize(("body", "reason"), [
    (b"\x02r\x02\x02\x0c", "truncated"),                 # ends after the type enum
    (b"\x02r\x02\x02\x01\x0a", "invalid_body"),          # enum index -1
    (b"\x02r\x02\x02" + b"\xff" * 11, "invalid_body"),  # an eleven-byte varint
])
def test_the_codec_reports_malformed_bodies_of_its_own_schema_with_their_reason(body: bytes,
                                                                               reason: str) -> None:
    codec = Codec()
    data = codec.encode(RunEvent("r", 1, 1, EventType.STAGE_STARTED, 5))[:10] + body
    with pytest.raises(DecodeError) as err:
        codec.decode(data, RunEvent)
    assert err.value.reason == reason


def test_an_int_outside_32_bits_is_refused_rather_than_written_unreadable() -> None:
    from runlog.schemas._avro_gen import OutOfRange

    event = RunEvent("r", 1, 1, EventType.STAGE_STARTED, 5, hash_version=2**31)
    with pytest.raises(OutOfRange, match="32 bits"):
        Codec().encode(event)
    top = RunEvent("r", 1, 1, EventType.STAGE_STARTED, 5, hash_version=2**31 - 1)
    assert Codec().decode(Codec().encode(top), RunEvent).hash_version == 2**31 - 1


def test_the_hash_of_an_event_over_the_default_record_size_needs_no_codec_limit() -> None:
    from runlog.schemas._hash import event_hash

    big = RunEvent("r", 1, 1, EventType.STAGE_STARTED, 5, attributes={"blob": "x" * 1_200_000})
    assert len(event_hash(big)) == 64  # a v2 hash encodes the event without a size limit


def _event_body(**fields: Any) -> tuple[bytes, bytes]:
    """(single-object header, Avro body) of a ``STAGE_STARTED`` event written by the codec."""
    data = Codec().encode(RunEvent("r", 1, 1, EventType.STAGE_STARTED, 5, **fields))
    return data[:10], data[10:]


@pytest.mark.parametrize("value", [2**31, -(2**31) - 1, 2**40, -(2**62)])
def test_an_int_outside_32_bits_on_the_wire_is_refused_by_the_generated_reader(value: int) -> None:
    """``hash_version`` is an Avro ``int`` (the field before ``usage``, the last of a ``RunEvent``): a
    body whose varint there holds more than 32 bits is refused, not read as a Python int (fastavro
    would read it)."""
    head, body = _event_body(hash_version=2)
    no_usage = b"\x00"  # the usage union's null branch
    assert body.endswith(write_long(2) + no_usage)
    decode = compile_schema(PARSED["runlog.RunEvent"])[1]
    for edge in (2**31 - 1, -(2**31)):  # the last values that fit are read
        ok = body[:-2] + write_long(edge) + no_usage
        assert decode(ok, 0) == ({**decode(body, 0)[0], "hash_version": edge}, len(ok))
    bad = body[:-2] + write_long(value) + no_usage

    with pytest.raises(ValueError, match="int range"):
        decode(bad, 0)
    with pytest.raises(DecodeError) as err:
        Codec().decode(head + bad, RunEvent)
    assert err.value.reason == "invalid_body" and "int range" in err.value.detail


@pytest.mark.parametrize("index_byte", [0x01, 0x03, 0x7F])  # zig-zag -1, -2, -64
def test_a_negative_union_index_is_refused_by_the_generated_reader(index_byte: int) -> None:
    """``stage`` is ``["null", "string"]``: its branch index 1 (byte 0x02) replaced by a negative
    one (Python would index the branch list from its end) is refused, the rest of the body intact."""
    head, body = _event_body(stage="s")
    at = body.index(b"\x02\x02s")  # branch 1, then the string "s" (length 1)
    symbols = PARSED["runlog.RunEvent"]["fields"][3]["type"]["symbols"]
    assert body[:at] == b"\x02r\x02\x02" + write_long(symbols.index("STAGE_STARTED")) + b"\x0a"
    assert Codec().decode(head + body, RunEvent).stage == "s"
    bad = body[:at] + bytes([index_byte]) + body[at + 1:]
    decode = compile_schema(PARSED["runlog.RunEvent"])[1]

    with pytest.raises(ValueError, match="union branch"):
        decode(bad, 0)
    with pytest.raises(DecodeError) as err:
        Codec().decode(head + bad, RunEvent)
    assert err.value.reason == "invalid_body" and "union branch" in err.value.detail
