"""Schema versions during a rolling upgrade: writers pinned to an older version
(``RUNLOG_SCHEMA_VERSION``), and readers that look an unknown writer schema up before refusing."""

from __future__ import annotations

import copy
import io
import json
import struct
from typing import Any

import fastavro
import pytest

from runlog.schemas import (
    Codec,
    ConfigError,
    DecodeError,
    EventType,
    ResumeRequest,
    RunEvent,
    SchemaVersionError,
    Settings,
    Usage,
)
from runlog.schemas._avsc import load_file, writer_for
from runlog.schemas._versions import USAGE_ATTRIBUTE


def _event(**kw: Any) -> RunEvent:
    base: dict[str, Any] = dict(run_id="r1", seq=1, epoch=1, type=EventType.TOOL_RESULT, occurred_at=1)
    base.update(kw)
    return RunEvent(**base)


def _read_as(data: bytes, file: str) -> dict[str, Any]:
    """What a reader whose newest schema is ``file`` reads: it must know the fingerprint."""
    doc = load_file(file)
    w = writer_for(doc)
    assert data[2:10] == w.fingerprint, "a reader of this version would not know the writer schema"
    out: dict[str, Any] = fastavro.schemaless_reader(io.BytesIO(data[10:]), w.parsed, None)
    return out


@pytest.mark.parametrize(("version", "file"), [(3, "run_event.v3.avsc"), (4, "run_event.v4.avsc")])
def test_a_pinned_writer_writes_the_versions_schema_and_its_reader_reads_every_field(
        version: int, file: str) -> None:
    ev = _event(tool="t", attributes={"k": "v"}, hash_version=2, prev_hash="ab" * 32)
    data = Codec(schema_version=version).encode(ev)
    old = _read_as(data, file)
    assert (old["run_id"], old["type"], old["tool"], old["attributes"], old["hash_version"]) == \
        ("r1", "TOOL_RESULT", "t", {"k": "v"}, 2)
    assert Codec().decode(data, RunEvent) == ev  # and the current reader reads it as written


def test_usage_travels_in_attributes_below_version_5_and_is_read_back_as_usage() -> None:
    usage = Usage(model="m", input_tokens=7, output_tokens=2, cost_nanos=30)
    data = Codec(schema_version=4).encode(_event(usage=usage, attributes={"k": "v"}))
    old = _read_as(data, "run_event.v4.avsc")
    assert json.loads(old["attributes"][USAGE_ATTRIBUTE])["input_tokens"] == 7
    back = Codec().decode(data, RunEvent)
    assert back.usage == usage and back.attributes == {"k": "v"}


def test_an_event_type_newer_than_the_pin_is_refused_with_a_typed_error() -> None:
    up = _event(type=EventType.RUN_UPGRADED)
    with pytest.raises(SchemaVersionError) as err:
        Codec(schema_version=3).encode(up)
    assert err.value.version == 3 and err.value.feature == "event type RUN_UPGRADED"
    assert "RUNLOG_SCHEMA_VERSION" in str(err.value)
    assert isinstance(err.value, ConfigError)
    Codec(schema_version=4).encode(up)  # version 4 has it


def test_a_writer_pinned_to_3_writes_resume_requests_a_version_3_reader_of_before_seen_epoch_reads() -> None:
    """ResumeRequest gained seen_epoch while the version was 3: a writer pinned to 3 wrote the new
    schema, whose fingerprint the releases of version 3 made before it do not know (dead letters)."""
    req = ResumeRequest("r1", 5, "crash", "w-1", seen_epoch=4)
    data = Codec(schema_version=3).encode(req)
    old = _read_as(data, "resume_request.v1.avsc")
    assert (old["run_id"], old["reason"]) == ("r1", "crash") and "seen_epoch" not in old
    back = Codec().decode(data, ResumeRequest)  # this release reads it: no epoch to check against
    assert (back.run_id, back.reason, back.seen_epoch) == ("r1", "crash", None)
    for version in (4, None):  # version 4's releases came after seen_epoch: the current schema
        assert Codec(schema_version=version).decode(Codec(schema_version=version).encode(req),
                                                    ResumeRequest).seen_epoch == 4


def test_the_pin_is_a_setting_checked_at_start() -> None:
    assert Settings.from_env({"RUNLOG_SCHEMA_VERSION": "4"}).schema_version == 4
    assert Settings.from_env({}).schema_version is None
    for bad in ("2", "6"):
        with pytest.raises(ConfigError, match="RUNLOG_SCHEMA_VERSION must be between 3 and 5"):
            Settings.from_env({"RUNLOG_SCHEMA_VERSION": bad})
    s = Settings.from_env({"RUNLOG_SCHEMA_VERSION": "4"})
    assert Settings.from_env(s.to_env()) == s
    assert Codec.from_settings(s, schema_log=False).schema_version == 4
    # pinned below the current version, payloads go to the artifact store (older readers lack data: URIs)
    assert s.inline_payload_bytes == 0 and Settings().inline_payload_bytes == 512


def _future() -> tuple[dict[str, Any], bytes]:
    """A newer RunEvent schema than this release knows: a new field and a new event type."""
    doc = copy.deepcopy(Codec().schema("runlog.RunEvent"))
    doc["fields"].append({"name": "future_field", "type": "string", "default": ""})
    doc["fields"][3]["type"]["symbols"].append("RUN_FUTURE")
    assert doc["fields"][3]["name"] == "type"
    return doc, writer_for(doc).fingerprint


def _future_bytes(doc: dict[str, Any], fp: bytes, kind: str) -> bytes:
    buf = io.BytesIO()
    buf.write(b"\xc3\x01" + fp)
    rec = {"run_id": "r1", "seq": 1, "epoch": 1,
           "type": kind, "occurred_at": 5, "future_field": "x"}
    fastavro.schemaless_writer(buf, writer_for(doc).parsed, rec)
    return buf.getvalue()


class _Log:
    """An in-memory schema log."""

    def __init__(self) -> None:
        self.docs: dict[bytes, dict[str, Any]] = {}
        self.asked = 0

    def publish(self, record_name: str, fingerprint: bytes, schema: dict[str, Any]) -> None:
        self.docs[fingerprint] = schema

    def lookup(self, fingerprint: bytes) -> dict[str, Any] | None:
        self.asked += 1
        return self.docs.get(fingerprint)


def test_an_unknown_writer_schema_is_looked_up_then_resolved_new_symbols_read_as_unknown() -> None:
    doc, fp = _future()
    data = _future_bytes(doc, fp, "RUN_FUTURE")
    with pytest.raises(DecodeError) as err:
        Codec().decode(data, RunEvent)
    assert err.value.reason == "unknown_schema"
    log = _Log()
    codec = Codec().with_schema_log(log)
    with pytest.raises(DecodeError, match="asked the schema log"):
        codec.decode(data, RunEvent)
    log.publish("runlog.RunEvent", fp, doc)
    ev = codec.decode(data, RunEvent)
    assert (ev.run_id, ev.type, ev.occurred_at) == ("r1", EventType.UNKNOWN, 5)  # the field dropped
    assert codec.decode(_future_bytes(doc, fp, "TOOL_CALLED"), RunEvent).type is EventType.TOOL_CALLED
    asked = log.asked
    codec.decode(data, RunEvent)
    assert log.asked == asked, "a schema found once is kept"


def test_a_published_schema_must_have_the_fingerprint_it_is_published_under() -> None:
    doc, fp = _future()
    log = _Log()
    other = copy.deepcopy(doc)
    other["fields"].append({"name": "more", "type": "int", "default": 0})
    log.docs[fp] = other
    with pytest.raises(DecodeError, match="has fingerprint") as err:
        Codec().with_schema_log(log).decode(_future_bytes(doc, fp, "RUN_FUTURE"), RunEvent)
    assert err.value.reason == "unknown_schema"


def test_a_writer_publishes_its_schema_before_its_first_record() -> None:
    log = _Log()
    codec = Codec(schema_version=4).with_schema_log(log)
    data = codec.encode(_event())
    assert list(log.docs) == [data[2:10]]
    assert writer_for(log.docs[data[2:10]]).fingerprint == data[2:10]
    assert struct.unpack("<Q", data[2:10]) != struct.unpack("<Q", Codec().fingerprint("runlog.RunEvent"))


def test_a_registry_codec_finds_a_single_object_fingerprint_among_the_registered_versions() -> None:
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    doc, fp = _future()
    client = SchemaRegistryClient.new_client({"url": "mock://upgrade-versions"})
    client.register_schema("runlog.RunEvent", Schema(json.dumps(doc), "AVRO"))
    codec = Codec(client)
    ev = codec.decode(_future_bytes(doc, fp, "RUN_FUTURE"), RunEvent)
    assert ev.type is EventType.UNKNOWN


def test_writer_schemas_published_ahead_are_not_published_again_by_the_first_encode() -> None:
    from runlog.schemas import Checkpoint, Effect

    log = _Log()
    codec = Codec().with_schema_log(log)
    codec.publish_writer_schemas(Checkpoint, Effect)
    assert set(log.docs) == {codec.fingerprint("runlog.Checkpoint"), codec.fingerprint("runlog.Effect")}
    log.publish = lambda *a: pytest.fail("published again")  # type: ignore[method-assign]
    codec.encode(Checkpoint("r1:1", "r1", 1, 0, 0, "work", 5))
    with pytest.raises(ConfigError, match="not a Runlog record"):
        codec.publish_writer_schemas(dict)
