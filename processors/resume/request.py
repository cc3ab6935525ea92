"""Asking for a resume: an acknowledged ``ResumeRequest`` on the resume topic, keyed by run id,
with the CloudEvents headers every Runlog record carries; the resumer service consumes it."""

from __future__ import annotations

from confluent_kafka import Producer

from runlog.producers.internal import CloudEventHeaders, send_resume_request
from runlog.schemas import Codec, ResumeRequest, Settings, Topics, now_ms

__all__ = ["request_resume"]


def request_resume(settings: Settings, run_id: str, reason: str, *, requested_by: str = "cli",
                   producer: Producer | None = None, codec: Codec | None = None,
                   seen_epoch: int | None = None) -> None:
    """Append a ``ResumeRequest`` for a run to the resume topic (acknowledged before returning).

    ``seen_epoch`` is the run's lease epoch as the requester saw it: a resumer that finds a later
    epoch (another resume, or an operator, moved the run since) does nothing and answers
    ``superseded``. None (the sweep): no such check; the run's status still decides.

    Raises:
        DeliveryError: the request was not stored within 30 seconds.
    """
    topic = Topics.of(settings).resume
    p = producer or Producer(settings.producer_config())
    send_resume_request(p, CloudEventHeaders(topic, requested_by), codec or Codec.from_settings(settings),
                        ResumeRequest(run_id, now_ms(), reason, requested_by, seen_epoch), topic=topic)
