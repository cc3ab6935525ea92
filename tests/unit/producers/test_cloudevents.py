"""The CloudEvents headers of the writer's records (pure: no broker)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from runlog.producers.log._cloudevents import (
    CONTENT_TYPE_REGISTRY,
    CONTENT_TYPE_SINGLE_OBJECT,
    CloudEventHeaders,
    content_type,
    rfc3339_millis,
    run_event_id,
    source_uri,
)
from runlog.schemas import Codec, EventType, ResumeRequest, RunEvent

EVENT = RunEvent(run_id="run-1", seq=7, epoch=2, type=EventType.TOOL_CALLED, occurred_at=1_767_323_045_678,
                 stage="draft", call_id="draft/search/0")


def as_text(headers: list[tuple[str, str | bytes | None]]) -> dict[str, str]:
    out = {}
    for k, v in headers:
        assert isinstance(v, str | bytes)
        out[k] = v.decode() if isinstance(v, bytes) else v
    return out


def test_run_event_headers() -> None:
    value = Codec().encode(EVENT)
    h = CloudEventHeaders("prod.runlog.events", "writer-abc")
    assert as_text(h.run_event(EVENT, value)) == {
        "ce_specversion": "1.0",
        "ce_id": "run-1:7:2",
        "ce_source": "runlog://prod.runlog.events/writer-abc",
        "ce_type": "dev.runlog.run.TOOL_CALLED",
        "ce_time": "2026-01-02T03:04:05.678Z",
        "ce_subject": "run-1",
        "content-type": "application/avro; framing=single-object",
    }


def test_the_id_names_the_event() -> None:
    h = CloudEventHeaders("runlog.events", "w")
    value = Codec().encode(EVENT)
    same = replace(EVENT)
    assert h.run_event(same, value) == h.run_event(EVENT, value)  # a copy of the event: the same headers
    assert run_event_id(EVENT) == "run-1:7:2"
    ids = {run_event_id(e) for e in (EVENT, replace(EVENT, seq=8), replace(EVENT, epoch=3),
                                     replace(EVENT, run_id="run-10"), replace(EVENT, run_id="run-1:7"))}
    assert len(ids) == 5


def test_time_is_rfc3339_utc_with_milliseconds() -> None:
    for ms in (0, 1, 1, 999, 1000, 1000, 1_767_323_045_678, 1_767_323_045_678, 1_767_323_045_001,
               1_767_323_046_000, 4_102_444_800_000, 0):  # repeated: the last millisecond is cached
        text = rfc3339_millis(ms)
        assert text.endswith("Z") and len(text) == 24, text
        assert datetime.fromisoformat(text) == datetime.fromtimestamp(ms / 1000, UTC).replace(
            microsecond=(ms % 1000) * 1000)
    assert rfc3339_millis(-1) == "1969-12-31T23:59:59.999Z"


def test_content_type_follows_the_framing() -> None:
    assert content_type(b"\xc3\x01" + bytes(8)) == CONTENT_TYPE_SINGLE_OBJECT.encode()
    assert content_type(b"\x00\x00\x00\x00\x01") == CONTENT_TYPE_REGISTRY.encode()
    assert content_type(b"") == b"application/avro"


def test_source_escapes_the_writer_id() -> None:
    assert source_uri("t1.runlog.events", "host a/1") == "runlog://t1.runlog.events/host%20a%2F1"


def test_resume_request_headers() -> None:
    req = ResumeRequest("run-1", 1_767_323_045_678, "lease expired", "writer-abc")
    value = Codec().encode(req)
    h = CloudEventHeaders("runlog.resume", "writer-abc")
    got = as_text(h.resume_request(req, value))
    assert got.pop("ce_id") != as_text(h.resume_request(req, value))["ce_id"]  # one id per request
    assert got == {
        "ce_specversion": "1.0",
        "ce_source": "runlog://runlog.resume/writer-abc",
        "ce_type": "dev.runlog.resume.requested",
        "ce_time": "2026-01-02T03:04:05.678Z",
        "ce_subject": "run-1",
        "content-type": "application/avro; framing=single-object",
    }
    assert as_text(h.resume_request(req, value, "id-1"))["ce_id"] == "id-1"
