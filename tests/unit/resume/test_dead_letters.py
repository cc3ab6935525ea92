"""The resumer dead-letters with the one header builder (``runlog.processors.dlq``), as the projector does."""

from __future__ import annotations

from typing import Any

from runlog.processors.dlq import (
    H_DETAIL,
    H_OFFSET,
    H_PARTITION,
    H_REASON,
    H_TOPIC,
    MAX_DETAIL,
    headers,
    parse_headers,
)
from runlog.processors.metrics import ResumerMetrics
from runlog.processors.resume import ResumerService
from runlog.schemas import Settings, Topics


class _Msg:
    def topic(self) -> str:
        return "p.runlog.resume"

    def partition(self) -> int:
        return 2

    def offset(self) -> int:
        return 17

    def key(self) -> bytes:
        return b"run-1"

    def value(self) -> bytes:
        return b"\x00junk"


class _Producer:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def produce(self, topic: str, **kw: Any) -> None:
        self.sent.append({"topic": topic, **kw})

    def flush(self, timeout: float) -> int:
        return 0


def test_the_headers_say_why_and_where_from() -> None:
    h = dict(headers("unknown_schema", "é" * (MAX_DETAIL + 5), "t", 3, 41))
    assert list(h) == [H_REASON, H_DETAIL, H_TOPIC, H_PARTITION, H_OFFSET]
    assert parse_headers(h) == {H_REASON: "unknown_schema", H_DETAIL: "é" * MAX_DETAIL, H_TOPIC: "t",
                                H_PARTITION: "3", H_OFFSET: "41"}


def test_a_resume_request_is_dead_lettered_with_the_shared_headers() -> None:
    svc = ResumerService.__new__(ResumerService)
    svc.topics = Topics.of(Settings.from_env({}, topic_prefix="p."))
    svc.metrics = ResumerMetrics()
    svc.producer = _Producer()  # type: ignore[assignment]
    svc._dead_letter(_Msg(), "unknown_run", "no run 'run-1'")  # type: ignore[arg-type]
    (sent,) = svc.producer.sent  # type: ignore[attr-defined]
    assert sent["topic"] == svc.topics.dlq and sent["key"] == b"run-1" and sent["value"] == b"\x00junk"
    assert sent["headers"] == list(headers("unknown_run", "no run 'run-1'", "p.runlog.resume", 2, 17))
