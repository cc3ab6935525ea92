"""The streams topic's record and configuration: ``runlog.StreamRecord`` round-trips through the
codec, a kind from a newer schema reads as ``UNKNOWN``, and ``RUNLOG_STREAMS_RETENTION_MS`` sets the
topic's retention."""

from __future__ import annotations

import copy
import io

import fastavro

from runlog.schemas import Codec, Settings, StreamKind, StreamRecord, Topics, load_schema
from runlog.schemas._avsc import writer_for
from runlog.schemas._codec import SINGLE_OBJECT_MAGIC


def test_a_stream_record_round_trips() -> None:
    codec = Codec()
    r = StreamRecord("run-1", "s", "s/model/0", 3, 1_700_000_000_000, StreamKind.DELTA, attempt=2, index=7,
                     part=0, text="héllo", produced_ns=123)
    assert codec.decode(codec.encode(r), StreamRecord) == r


def test_a_kind_from_a_newer_schema_reads_as_unknown() -> None:
    newer = copy.deepcopy(load_schema("runlog.StreamRecord"))
    kind = next(f for f in newer["fields"] if f["name"] == "kind")
    kind["type"]["symbols"] = [*kind["type"]["symbols"], "TOOL_PROGRESS"]
    codec = Codec()
    fp = codec.add_writer_schema(newer)
    w = writer_for(newer)
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, w.parsed, {
        "run_id": "r", "stage": "s", "call_id": "c", "epoch": 1, "attempt": 1, "kind": "TOOL_PROGRESS",
        "index": 0, "part": None, "text": None, "data": "{}", "occurred_at": 1, "produced_ns": 0})
    got = codec.decode(SINGLE_OBJECT_MAGIC + fp + buf.getvalue(), StreamRecord)
    assert got.kind is StreamKind.UNKNOWN and got.data == "{}"


def test_streams_retention_is_configurable() -> None:
    default = {s.name: s for s in Topics("").specs(Settings())}["runlog.streams"]
    assert default.config["retention.ms"] == str(7 * 24 * 3600 * 1000)
    assert default.config["cleanup.policy"] == "delete"
    s = Settings.from_env({"RUNLOG_STREAMS_RETENTION_MS": "3600000"})
    spec = {t.name: t for t in Topics("p.").specs(s)}["p.runlog.streams"]
    assert spec.config["retention.ms"] == "3600000"
    assert Settings.from_env(s.to_env()).streams_retention_ms == 3_600_000
