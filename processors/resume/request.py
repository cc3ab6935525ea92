"""Asking for a resume: an acknowledged ``ResumeRequest`` on the resume topic, keyed by run id,
with the CloudEvents headers every Runlog record carries; the resumer service consumes it."""

from __future__ import annotations

from confluent_kafka import Producer

from producers._cloudevents import CloudEventHeaders
from schemas import Codec, DeliveryError, ResumeRequest, Settings, Topics, now_ms

__all__ = ["request_resume"]


def request_resume(settings: Settings, run_id: str, reason: str, *, requested_by: str = "cli",
                   producer: Producer | None = None, codec: Codec | None = None) -> None:
    """Append a ``ResumeRequest`` for a run to the resume topic (acknowledged before returning)."""
    cdc = codec or Codec.from_settings(settings)
    p = producer or Producer(settings.producer_config())
    req = ResumeRequest(run_id, now_ms(), reason, requested_by)
    value = cdc.encode(req)
    errors: list[str] = []
    topic = Topics.of(settings).resume
    p.produce(topic, key=run_id.encode(), value=value,
              headers=CloudEventHeaders(topic, requested_by).resume_request(req, value),
              on_delivery=lambda err, msg: errors.append(str(err)) if err else None)
    if p.flush(30) != 0 or errors:
        raise DeliveryError(Topics.of(settings).resume, run_id, errors[0] if errors else "flush timed out")
