"""W3C trace context as records carry it: validation, headers, attributes, the current context."""

from __future__ import annotations

import pytest

from runlog.producers.log._cloudevents import CloudEventHeaders
from runlog.schemas import EventType, ResumeRequest, RunEvent
from runlog.schemas._tracecontext import (
    TraceContext,
    carrying,
    current,
    distinct_contexts,
    from_attributes,
    from_headers,
    parse,
)

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TS = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"


def test_a_valid_traceparent_parses_with_its_ids_flags_and_state() -> None:
    tc = parse(TP, TS)
    assert tc is not None
    assert tc.trace_id == "0af7651916cd43dd8448eb211c80319c" and tc.span_id == "b7ad6b7169203331"
    assert tc.sampled and tc.tracestate == TS
    assert tc.headers == (("traceparent", TP.encode()), ("tracestate", TS.encode()))
    assert tc.attributes() == {"traceparent": TP, "tracestate": TS}
    unsampled = parse(TP[:-2] + "00")
    assert unsampled is not None and not unsampled.sampled
    assert unsampled.headers == (("traceparent", (TP[:-2] + "00").encode()),)  # no empty tracestate
    assert parse(TP.encode(), TS.encode()) == tc


@pytest.mark.parametrize("bad", [
    "", "garbage", TP.upper(), TP + "-extra",  # version 00 is exactly 55 characters
    "ff" + TP[2:],  # version ff is invalid
    "00-00000000000000000000000000000000-b7ad6b7169203331-01",  # all-zero trace id
    "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",  # all-zero span id
    "00-0af7651916cd43dd8448eb211c8031-b7ad6b7169203331-01",  # short trace id
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333-01",
    "0-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    b"\xff\xfe",
])
def test_an_invalid_traceparent_is_none(bad: str | bytes) -> None:
    assert parse(bad) is None


def test_a_later_version_is_read_by_its_first_fields_and_carried_as_version_00() -> None:
    tc = parse("cc" + TP[2:] + "-what-the-future-adds")
    assert tc is not None and tc.traceparent == TP


def test_a_tracestate_too_long_or_not_printable_is_dropped_and_the_context_kept() -> None:
    for state in ("a=" + "x" * 600, "a=b\nc=d"):
        tc = parse(TP, state)
        assert tc is not None and tc.tracestate == "" and len(tc.headers) == 1


def test_headers_give_the_context_the_w3c_one_first_then_the_cloudevents_one() -> None:
    assert from_headers(None) is None and from_headers([]) is None
    assert from_headers([("ce_id", b"x"), ("content-type", b"y")]) is None
    other = "00-11111111111111111111111111111111-2222222222222222-01"
    tc = from_headers([("ce_traceparent", other.encode()), ("traceparent", TP.encode()),
                       ("tracestate", TS.encode())])
    assert tc == TraceContext(TP, TS)
    ce = from_headers([("ce_traceparent", other.encode())])
    assert ce is not None and ce.traceparent == other
    assert from_headers({"traceparent": TP.encode()}) == TraceContext(TP)
    assert from_headers([("traceparent", b"not-one")]) is None
    assert from_attributes({"traceparent": TP, "tracestate": TS}) == TraceContext(TP, TS)
    assert from_attributes({"runlog.stages": "{}"}) is None


def test_the_current_context_is_set_for_a_block_only() -> None:
    tc = parse(TP)
    assert current() is None
    with carrying(tc):
        assert current() is tc
        with carrying(None):
            assert current() is None
        assert current() is tc
    assert current() is None


def _event() -> RunEvent:
    return RunEvent(run_id="run-1", seq=3, epoch=2, type=EventType.STAGE_STARTED,
                    occurred_at=1_700_000_000_123)


def test_records_carry_the_trace_headers_only_when_traced() -> None:
    ce = CloudEventHeaders("t.runlog.events", "w-1")
    value = b"\xc3\x01" + b"\x00" * 8
    plain = ce.run_event(_event(), value)
    assert len(plain) == 7 and not [k for k, _ in plain if k in ("traceparent", "tracestate")]
    tc = parse(TP, TS)
    traced = ce.run_event(_event(), value, tc)
    assert traced[:7] == plain and traced[7:] == [("traceparent", TP.encode()), ("tracestate", TS.encode())]
    assert from_headers(traced) == tc
    req = ResumeRequest("run-1", 1_700_000_000_123, "why", "cli", None)
    plain_req = ce.resume_request(req, value, "id-1")
    assert len(plain_req) == 7 and from_headers(plain_req) is None
    assert from_headers(ce.resume_request(req, value, "id-1", trace=tc)) == tc


def test_the_distinct_contexts_of_a_batch_are_parsed_once_each_in_first_seen_order() -> None:
    other = "00-11111111111111111111111111111111-2222222222222222-01"
    batch = [
        [("ce_id", b"a"), ("traceparent", TP.encode()), ("tracestate", TS.encode())],
        None,
        [("ce_id", b"b")],
        [("traceparent", other.encode())],
        [("traceparent", TP.encode()), ("tracestate", TS.encode())],
        [("traceparent", b"00-bad")],
        {"ce_traceparent": other.encode()},
        [("traceparent", TP.encode())],  # another tracestate: another context
    ]
    assert distinct_contexts(batch) == [TraceContext(TP, TS), TraceContext(other), TraceContext(TP)]
    assert distinct_contexts([]) == [] and distinct_contexts([None, [("ce_id", b"x")]]) == []
