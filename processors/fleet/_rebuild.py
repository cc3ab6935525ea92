"""Rebuild an App's queues from the log: pending = the submissions on the submissions topic whose run
is not on the events topic (``runlog queues rebuild``, and a worker that finds its queues' keys
missing at start or while it serves).

Marks the App's queues built first (``B:built``: what a worker checks to tell a lost Redis from a
kept one), then reads both topics up to their high watermarks. Queuing is idempotent (a run
pending, running, or started within a day is not queued again), and a run queued while its start
is under way starts once all the same: the start is the keyed start, and a second dispatch of a
started run finds it ``existing``. A submission dead-lettered before is queued again and
dead-lettered again when it is dispatched (its reason does not change).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from runlog.processors.fleet._queues import RedisQueues
from runlog.processors.resume import App
from runlog.schemas import Codec, DecodeError, RunSubmission, Settings, Topics

__all__ = ["RebuildReport", "rebuild_queues"]


@dataclass
class RebuildReport:
    """What a rebuild read and queued."""

    submissions: int = 0
    """Submissions of the App's workflows on the topic (each run once)."""
    started: int = 0
    """Of them, runs on the events topic (not queued)."""
    queued: dict[str, int] = field(default_factory=dict)
    """Per queue, the submissions queued again."""
    already: int = 0
    """Pending, running or started within a day already (left as they were)."""


def rebuild_queues(settings: Settings, app: App, queues: RedisQueues) -> RebuildReport:
    """Queue again every submission of ``app``'s workflows whose run has not started (the module
    docstring); declares the App's queues first."""
    from runlog.projections.log_reader import read_topic

    for name in dict.fromkeys([*(q.name for q in app.queues), "default"]):
        queues.declare(app.queue(name))
        queues.mark_built(name)
    topics = Topics.of(settings)
    codec = Codec.from_settings(settings)
    subs: dict[str, tuple[RunSubmission, bytes]] = {}
    for batch in read_topic(settings, topic=topics.submissions):
        for m in batch:
            value = m.value()
            if value is None:
                continue
            try:
                sub = codec.decode(value, RunSubmission)
            except DecodeError:
                continue  # the intake dead-letters it; nothing to queue
            if sub.workflow in app.registry and sub.run_id not in subs:
                subs[sub.run_id] = (sub, value)
    on_log: set[str] = set()
    if subs:
        for batch in read_topic(settings):
            for m in batch:
                key = m.key()
                if key is not None:
                    on_log.add(key.decode("utf-8", "replace"))
    report = RebuildReport(submissions=len(subs))
    for run_id, (sub, value) in subs.items():
        if run_id in on_log:
            report.started += 1
        elif queues.enqueue(sub.queue, run_id, sub.tenant, sub.priority, sub.submitted_at, value):
            report.queued[sub.queue] = report.queued.get(sub.queue, 0) + 1
        else:
            report.already += 1
    return report
