"""CloudEvents 1.0 headers of Runlog's records, Kafka protocol binding, binary content mode (pure).

Every record the writer produces carries, as UTF-8 header values:

* ``ce_specversion``: ``1.0``;
* ``ce_id``: ``<run_id>:<seq>:<epoch>`` for a run event. It names one event: each
  lease acquisition of a run gets a new epoch and one writer never writes a seq
  twice, so (run id, seq, epoch) never names two different events, and every
  copy of an event (a producer retry, a duplicate, a replay) carries the same id.
  A resume request's id is a random UUID drawn once per request;
* ``ce_source``: ``runlog://<topic>/<writer id>``: the topic (with its prefix, so
  the deployment) and the writer that produced the record (its id percent-encoded);
* ``ce_type``: ``dev.runlog.run.<EVENT_TYPE>`` (``dev.runlog.run.STAGE_STARTED``), or
  ``dev.runlog.resume.requested`` for a resume request;
* ``ce_time``: ``occurred_at`` (``requested_at``) in RFC 3339, UTC, milliseconds;
* ``ce_subject``: the run id (also the record key);
* ``traceparent`` and ``tracestate`` (W3C Trace Context, the CloudEvents distributed-tracing
  extension's attributes) when the record is written while a trace is active
  (:mod:`runlog.schemas._tracecontext`); absent otherwise, so an untraced record costs nothing more;
* ``content-type``: ``application/avro; framing=single-object`` for Avro
  single-object encoding (``C3 01``, the 8-byte little-endian CRC-64-AVRO
  fingerprint of the writer schema, the body), ``application/avro;
  framing=schema-registry`` for the Schema Registry framing (``00``, the 4-byte
  big-endian schema id, the body).

The record value is the CloudEvent's data, unchanged. The constant parts are
encoded once per writer and topic, the run's own (``ce_subject``) once per run
(:class:`CloudEventHeaders`): the write path adds one formatted id and one
formatted time per event.
"""

from __future__ import annotations

import time
import uuid
from urllib.parse import quote

from runlog.schemas import EventType, ResumeRequest, RunEvent
from runlog.schemas.internal import TraceContext

__all__ = [
    "CONTENT_TYPE_REGISTRY",
    "CONTENT_TYPE_SINGLE_OBJECT",
    "RESUME_REQUEST_TYPE",
    "RUN_EVENT_TYPE_PREFIX",
    "SPECVERSION",
    "CloudEventHeaders",
    "Headers",
    "content_type",
    "rfc3339_millis",
    "run_event_id",
    "source_uri",
]

Headers = list[tuple[str, str | bytes | None]]
"""Header list as confluent-kafka's ``produce(headers=...)`` takes it."""

SPECVERSION = "1.0"
RUN_EVENT_TYPE_PREFIX = "dev.runlog.run."
RESUME_REQUEST_TYPE = "dev.runlog.resume.requested"
CONTENT_TYPE_SINGLE_OBJECT = "application/avro; framing=single-object"
CONTENT_TYPE_REGISTRY = "application/avro; framing=schema-registry"
_CONTENT_TYPES = {0xC3: CONTENT_TYPE_SINGLE_OBJECT.encode(), 0x00: CONTENT_TYPE_REGISTRY.encode()}
_AVRO = b"application/avro"
_SPECVERSION = SPECVERSION.encode()
_RESUME_TYPE = RESUME_REQUEST_TYPE.encode()


def source_uri(topic: str, writer_id: str) -> str:
    """``runlog://<topic>/<writer id>`` (Kafka topic names need no escaping; the writer id is escaped)."""
    return f"runlog://{topic}/{quote(writer_id, safe='')}"


def run_event_id(event: RunEvent) -> str:
    """``<run_id>:<seq>:<epoch>``: the same for every copy of an event, different for different events."""
    return f"{event.run_id}:{event.seq}:{event.epoch}"


_last_second: tuple[int, str] = (-1, "")
"""The last second formatted: a run's events mostly fall in the same second (replaced whole: thread-safe)."""
_last_milli: tuple[int, str] = (-1, "")
"""The last millisecond formatted: a busy writer appends tens of events in one (replaced whole)."""


def rfc3339_millis(ms: int) -> str:
    """Epoch milliseconds as RFC 3339 UTC with milliseconds: ``2026-01-02T03:04:05.678Z``."""
    global _last_second, _last_milli
    last_ms = _last_milli
    if last_ms[0] == ms:
        return last_ms[1]
    s, frac = divmod(ms, 1000)
    last = _last_second
    if last[0] != s:
        last = _last_second = (s, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(s)))
    out = f"{last[1]}.{frac:03d}Z"
    _last_milli = (ms, out)
    return out


def content_type(value: bytes) -> bytes:
    """The ``content-type`` of an encoded value, told by its framing's first byte."""
    return _CONTENT_TYPES.get(value[0], _AVRO) if value else _AVRO


class CloudEventHeaders:
    """The CloudEvents headers of one writer's records on one topic, constants encoded once.

    Args:
        topic: the topic the records go to (named in ``ce_source``).
        writer_id: the writer (named in ``ce_source``).
    """

    __slots__ = ("_runs", "_source", "_types", "source")

    _RUNS_KEPT = 4096
    """Runs whose constant headers are kept (all forgotten at once past it: rebuilt on next use)."""

    def __init__(self, topic: str, writer_id: str) -> None:
        self.source = source_uri(topic, writer_id)
        self._source = self.source.encode()
        self._types = {t: (RUN_EVENT_TYPE_PREFIX + t.value).encode() for t in EventType}
        self._runs: dict[str, tuple[tuple[str, bytes], tuple[str, bytes], tuple[str, bytes]]] = {}

    def run_event(self, event: RunEvent, value: bytes, trace: TraceContext | None = None) -> Headers:
        """The headers of one run event whose encoded value is ``value`` (``trace``: its context)."""
        run = self._runs.get(event.run_id)
        if run is None:  # built once per run: the spec version, the source, the subject
            if len(self._runs) >= self._RUNS_KEPT:
                self._runs.clear()
            run = self._runs[event.run_id] = (("ce_specversion", _SPECVERSION), ("ce_source", self._source),
                                              ("ce_subject", event.run_id.encode()))
        h: Headers = [
            run[0],
            ("ce_id", f"{event.run_id}:{event.seq}:{event.epoch}"),
            run[1],
            ("ce_type", self._types[event.type]),
            ("ce_time", rfc3339_millis(event.occurred_at)),
            run[2],
            ("content-type", content_type(value)),
        ]
        if trace is not None:
            h.extend(trace.headers)
        return h

    def resume_request(self, request: ResumeRequest, value: bytes, request_id: str | None = None,
                       trace: TraceContext | None = None) -> Headers:
        """The headers of one resume request (``ce_id``: ``request_id``, else a new random UUID;
        ``trace``: the context of who asked)."""
        h: Headers = [
            ("ce_specversion", _SPECVERSION),
            ("ce_id", request_id or str(uuid.uuid4())),
            ("ce_source", self._source),
            ("ce_type", _RESUME_TYPE),
            ("ce_time", rfc3339_millis(request.requested_at)),
            ("ce_subject", request.run_id),
            ("content-type", content_type(value)),
        ]
        if trace is not None:
            h.extend(trace.headers)
        return h
