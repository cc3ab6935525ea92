"""The schema log on the real broker: ``runlog init`` publishes every bundled schema, and a reader of
this release that meets a newer writer schema (published by its writer before the record) finds it
there and decodes the record instead of dead-lettering it."""

from __future__ import annotations

import copy
import io
from typing import Any

import fastavro
import pytest
from confluent_kafka import Producer

from runlog.schemas import Codec, EventType, RunEvent, Settings, Topics, load_past_schemas, load_schema
from runlog.schemas._avsc import RECORD_FILES, writer_for
from runlog.schemas._schema_log import SchemaLog

pytestmark = pytest.mark.integration


def test_init_publishes_every_bundled_schema(topics: Settings) -> None:
    log = SchemaLog(topics)  # a fresh reader: nothing cached in this process
    for name in RECORD_FILES:
        for doc in [*load_past_schemas(name), load_schema(name)]:
            fp = writer_for(doc).fingerprint
            found = log.lookup(fp)
            assert found is not None and writer_for(found).fingerprint == fp, (name, fp.hex())


def _future() -> dict[str, Any]:
    doc = copy.deepcopy(load_schema("runlog.RunEvent"))
    doc["fields"].append({"name": "future_field", "type": "string", "default": ""})
    assert doc["fields"][3]["name"] == "type"
    doc["fields"][3]["type"]["symbols"].append("RUN_FUTURE")
    return doc


def test_a_newer_writers_events_are_read_through_the_schema_log_and_rebuilt_without_dead_letters(
        topics: Settings) -> None:
    from runlog.projections import rebuild

    doc = _future()
    w = writer_for(doc)
    SchemaLog(topics).publish("runlog.RunEvent", w.fingerprint, doc)  # the newer writer, before its record
    p = Producer(topics.producer_config())
    for seq, kind in enumerate(["RUN_STARTED", "RUN_FUTURE", "RUN_COMPLETED"], start=1):
        buf = io.BytesIO()
        buf.write(b"\xc3\x01" + w.fingerprint)
        rec = {"run_id": "future-run", "seq": seq, "epoch": 1, "type": kind, "occurred_at": 1000 + seq,
               "future_field": "x"}
        fastavro.schemaless_writer(buf, w.parsed, rec)
        p.produce(Topics.of(topics).events, key=b"future-run", value=buf.getvalue())
    assert p.flush(30) == 0
    # a reader of this release, its process's cache bypassed: it finds the schema on the topic
    codec = Codec().with_schema_log(SchemaLog(topics))
    buf = io.BytesIO()
    buf.write(b"\xc3\x01" + w.fingerprint)
    fastavro.schemaless_writer(buf, w.parsed, {"run_id": "x", "seq": 1, "epoch": 1, "type": "RUN_FUTURE",
                                               "occurred_at": 1})
    assert codec.decode(buf.getvalue(), RunEvent).type is EventType.UNKNOWN
    report = rebuild(topics, progress=None)
    assert (report.records, report.dead_letters) == (3, 0), report
