"""What the console reads, as plain blocking functions (the handlers run them on worker threads).

* the run list comes from the Redis projection (:class:`projections.RedisStore`);
* a run's page comes from the log: a :class:`RunFollower` feeds the run's records to the
  audit's :class:`~processors.audit.Auditor` (the one fold plus the audit's checks), so the
  console's timeline is ``runlog audit``'s view of the run, and it keeps following the
  partition from where it stopped;
* health comes from Kafka (consumer group offsets against high watermarks, the dead-letter
  topic) and from Redis (the namespace marker, the rebuild lock).

Nothing here writes: no group is joined or committed (watermarks and offsets are asked of
the admin API; reads assign partitions), Redis is only read.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from processors._audit_html import KIND_CLASS, event_bits, event_classes
from processors.audit import AuditOptions, Auditor, RunAudit
from processors.dlq import H_DETAIL, H_OFFSET, H_PARTITION, H_REASON, H_TOPIC, parse_headers
from projections import RedisStore, RunState, RunStatus
from schemas import Codec, DecodeError, RunEvent, RunlogError, Settings, Topics, partition_for

__all__ = [
    "DeadLetterView",
    "GroupLag",
    "Health",
    "RunFollower",
    "RunRow",
    "RunsPage",
    "list_runs",
    "read_health",
    "timeline_items",
]

SCAN_LIMIT = 500
"""Newest runs loaded from Redis for one list page (filters and search apply to these): each one's
snapshot is read, and the page refreshes every few seconds."""

ATTENTION = (RunStatus.BLOCKED, RunStatus.WAITING, RunStatus.FAILED)
"""The statuses of runs that wait for a person (resolve or cancel, signal, retry)."""

SHOWN_EVENTS = 1000
"""A run's page draws at most this many of its latest events."""

SHOWN_ATTRIBUTES = ("signal",)
"""Event attributes the timeline shows beside the audit's entry fields (which already carry an
operator's ``by``, ``why``, ``decision`` and ``action``)."""


# -- the run list ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunRow:
    """One line of the run list."""

    run_id: str
    status: str
    workflow: str
    stage: str
    next_stage: str
    last_seq: int
    epoch: int
    updated_at: int
    reason: str
    """Why the run is blocked or failed (its last error), else empty."""
    open_effects: tuple[str, ...]
    """``tool call_id`` of every effect intent without a result."""
    waiting_for: str
    """The signal a ``WAITING`` run waits for, else empty."""

    @classmethod
    def of(cls, s: RunState) -> RunRow:
        err = s.last_error
        reason = f"{err.kind}: {err.message}" if err is not None and s.status in (
            RunStatus.BLOCKED, RunStatus.FAILED, RunStatus.CANCELLED) else ""
        return cls(
            run_id=s.run_id, status=s.status.value,
            workflow=f"{s.workflow_name}@{s.workflow_version}" if s.workflow is not None else "",
            stage=s.stage or "", next_stage=s.next_stage or "", last_seq=s.last_seq, epoch=s.epoch,
            updated_at=s.updated_at, reason=reason,
            open_effects=tuple(f"{e.tool or '?'} {e.call_id or ''}".strip() for e in s.open_intents),
            waiting_for=s.waiting.signal if s.waiting is not None else "",
        )

    def matches(self, q: str) -> bool:
        """Whether the search text occurs in the run id, workflow, stage, reason or awaited signal."""
        q = q.casefold()
        return any(q in v.casefold() for v in (self.run_id, self.workflow, self.stage, self.next_stage,
                                               self.reason, self.waiting_for, *self.open_effects))


@dataclass(frozen=True)
class RunsPage:
    """A filtered page of the run list, newest first, with counts by status."""

    rows: list[RunRow]
    counts: dict[str, int]
    """Runs per status in the whole projection."""
    scanned: int
    """Runs looked at (the newest :data:`SCAN_LIMIT` of the status asked for)."""
    matched: int
    workflows: list[str]
    """Workflows of the runs looked at (for the filter)."""
    attention: list[RunRow]
    """Blocked, waiting and failed runs: the ones a person has to act on (by status, newest first)."""


def list_runs(store: RedisStore, *, status: str = "", workflow: str = "", q: str = "",
              limit: int = 200) -> RunsPage:
    """The run list from the projection: ``status`` one of :class:`RunStatus` or empty for all,
    ``workflow`` ``name@version`` or a bare name, ``q`` a case-insensitive search text."""
    st = RunStatus(status) if status else None
    counts = {s.value: n for s, n in store.counts().items()}
    ids = store.runs(st)[::-1][:SCAN_LIMIT]
    states = store.load_states(ids)
    rows = [RunRow.of(states[i]) for i in ids if i in states]
    workflows = sorted({r.workflow for r in rows if r.workflow})
    picked = [r for r in rows
              if (not workflow or r.workflow == workflow or r.workflow.split("@", 1)[0] == workflow)
              and (not q or r.matches(q))]
    attention_ids = [i for s in ATTENTION for i in store.runs(s)[-SCAN_LIMIT:]]
    attention = sorted((RunRow.of(s) for s in store.load_states(attention_ids).values()
                        if s.status in ATTENTION),
                       key=lambda r: (ATTENTION.index(RunStatus(r.status)), -r.updated_at))
    return RunsPage(picked[:limit], counts, len(rows), len(picked), workflows, attention)


# -- one run, from the log ------------------------------------------------------------------------


class RunFollower:
    """One run's history from the events topic, read once and then followed.

    :meth:`poll` reads the run's partition from where the previous poll stopped up to the
    current high watermark (its own consumer, assigned, never committing) and feeds the run's
    records to an :class:`Auditor` (no artifact checks), so :meth:`view` is the audit report's
    entry for the run, findings included. Call :meth:`close` when done.
    """

    def __init__(self, settings: Settings, run_id: str) -> None:
        self.settings = settings
        self.run_id = run_id
        self.topic = Topics.of(settings).events
        self.codec = Codec.from_settings(settings)
        self.auditor = Auditor(self.topic, AuditOptions(run_id=run_id, check_artifacts=False),
                               codec=self.codec)
        self.partition: int | None = None
        self.next_offset = 0
        self.shown: dict[int, dict[str, str]] = {}
        """:data:`SHOWN_ATTRIBUTES` of the run's events, by offset."""
        self._consumer: Any = None

    @property
    def run(self) -> RunAudit | None:
        return self.auditor.report.runs.get(self.run_id)

    @property
    def state(self) -> RunState | None:
        run = self.run
        return None if run is None else run.state

    @property
    def events(self) -> int:
        run = self.run
        return 0 if run is None else len(run.events)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def poll(self, *, stall_s: float = 30.0) -> int:
        """Read what was appended since the last poll; how many of the run's events arrived.

        Raises:
            RunlogError: the topic cannot be read, or no progress for ``stall_s``.
        """
        from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

        before = self.events
        try:
            if self._consumer is None:
                self._consumer = Consumer(self.settings.consumer_config(
                    f"runlog-console-{uuid.uuid4().hex[:12]}",
                    **{"enable.partition.eof": False, "enable.auto.commit": False}))
            c = self._consumer
            if self.partition is None:
                md = c.list_topics(self.topic, timeout=10).topics.get(self.topic)
                if md is None or md.error is not None:
                    raise RunlogError(f"topic {self.topic!r} not found")
                self.partition = partition_for(self.run_id, len(md.partitions))
            tp = TopicPartition(self.topic, self.partition)
            lo, hi = c.get_watermark_offsets(tp, timeout=10)
            pos = max(lo, self.next_offset)
            if pos >= hi:
                self.next_offset = pos
                return 0
            c.assign([TopicPartition(self.topic, self.partition, pos)])
            key = self.run_id.encode("utf-8")
            idle_since = time.monotonic()
            while pos < hi:
                # ask for no more than what is left, so a short tail returns as soon as it is fetched
                msgs = c.consume(num_messages=max(1, min(500, hi - pos)), timeout=0.5)
                if not msgs:
                    at = c.position([tp])[0].offset
                    if at >= hi:  # only transaction markers were left
                        pos = at
                    elif time.monotonic() - idle_since > stall_s:
                        raise RunlogError(f"no progress reading {self.topic}[{self.partition}] at {pos}")
                    continue
                idle_since = time.monotonic()
                for m in msgs:
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            continue
                        raise RunlogError(f"reading {self.topic}: {err}")
                    pos = m.offset() + 1
                    self.auditor.feed(m.partition(), m.offset(), m.key(), m.value())
                    if m.key() == key:
                        self._remember_attributes(m.offset(), m.value())
            self.next_offset = pos
        except KafkaException as err:
            raise RunlogError(f"reading {self.topic}: {err}") from err
        return self.events - before

    def _remember_attributes(self, offset: int, value: bytes | None) -> None:
        try:
            ev = self.codec.decode(value or b"", RunEvent)
        except DecodeError:
            return
        shown = {k: v for k, v in ev.attributes.items() if k in SHOWN_ATTRIBUTES and v}
        if shown:
            self.shown[offset] = shown

    def view(self) -> dict[str, Any] | None:
        """The run as the audit report draws it (:meth:`RunAudit.to_dict`), with
        :data:`SHOWN_ATTRIBUTES` in its events, and only the latest :data:`SHOWN_EVENTS` events."""
        run = self.run
        if run is None:
            return None
        doc = run.to_dict()
        events = doc["events"]
        doc["hidden_events"] = max(0, len(events) - SHOWN_EVENTS)
        doc["events"] = [{**e, "attributes": self.shown.get(e["offset"], {})} for e in events[-SHOWN_EVENTS:]]
        doc["next_offset"] = self.next_offset
        return doc


_KIND_CLASS = {**KIND_CLASS, "EFFECT_RESOLVED": "operator", "RUN_CANCELLED": "operator",
               "SIGNAL_RECEIVED": "operator", "RUN_WAITING": "operator"}


def _event_line(ev: Mapping[str, Any], flagged: set[int]) -> dict[str, Any]:
    """One event as the audit page draws it (the audit's own classes and words), plus its attributes."""
    attrs = (f"{k}={v}" for k, v in sorted(ev.get("attributes", {}).items()))
    return {"classes": " ".join(event_classes(ev, flagged, _KIND_CLASS)),
            "text": " ".join(event_bits(ev, attrs)), "ev": ev}


def timeline_items(run: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The run's events grouped into stage blocks, in log order, as the audit page groups them:
    ``{"kind": "event", "line": ...}`` or ``{"kind": "stage", "block": ..., "lines": [...]}``."""
    flagged = {f["seq"] for f in run["findings"] if f["seq"] is not None}
    blocks = run["stages"]
    items: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    index = 0
    for ev in run["events"]:
        line = _event_line(ev, flagged)
        if ev["outcome"] != "accepted":  # a rejected or duplicate event stays where it arrived
            if current is not None:
                current["lines"].append(line)
            else:
                items.append({"kind": "event", "line": line})
            continue
        while index < len(blocks) and blocks[index]["to_seq"] < ev["seq"]:
            index += 1
        b = blocks[index] if index < len(blocks) else None
        if b is not None and b["from_seq"] <= ev["seq"] <= b["to_seq"]:
            if ev["seq"] == b["from_seq"] or current is None or current["block"] is not b:
                current = {"kind": "stage", "block": b, "lines": []}
                items.append(current)
            current["lines"].append(line)
            if ev["seq"] == b["to_seq"]:
                current = None
        else:
            current = None
            items.append({"kind": "event", "line": line})
    return items


# -- health ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupLag:
    """A consumer group on one topic: its members and how far it is behind the high watermarks."""

    group: str
    role: str
    topic: str
    state: str
    members: int
    lag: int
    """Records between the group's committed offsets and the high watermarks (partitions it
    never committed count from their low watermark)."""
    uncommitted: int
    """Partitions with records the group never committed an offset for."""
    error: str = ""


@dataclass(frozen=True)
class DeadLetterView:
    partition: int
    offset: int
    timestamp_ms: int
    reason: str
    detail: str
    origin: str


@dataclass
class Health:
    """The projector's and the resumers' health as Kafka and Redis show it."""

    groups: list[GroupLag] = field(default_factory=list)
    dead_letters: int = 0
    latest_dead_letters: list[DeadLetterView] = field(default_factory=list)
    marker: str = ""
    """The projection namespace: ``ready``, ``rebuilding`` or ``missing``."""
    rebuild_locked: bool = False
    counts: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    read_at: int = 0


def _watermarks(admin: Any, topic: str, timeout: float) -> dict[int, tuple[int, int]]:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    md = admin.list_topics(topic, timeout=timeout).topics.get(topic)
    if md is None or md.error is not None:
        raise RunlogError(f"topic {topic!r} not found")
    parts = sorted(md.partitions)
    lows = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.earliest() for p in parts},
                              request_timeout=timeout)
    highs = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.latest() for p in parts},
                               request_timeout=timeout)
    lo = {tp.partition: int(f.result().offset) for tp, f in lows.items()}
    hi = {tp.partition: int(f.result().offset) for tp, f in highs.items()}
    return {p: (lo[p], hi[p]) for p in parts}


def _group_lag(admin: Any, group: str, role: str, topic: str, marks: Mapping[int, tuple[int, int]],
               timeout: float) -> GroupLag | None:
    """The group's lag on ``topic``; None when it has neither offsets nor members there."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    desc = admin.describe_consumer_groups([group], request_timeout=timeout)[group].result()
    members = [m for m in desc.members
               if any(tp.topic == topic for tp in (m.assignment.topic_partitions if m.assignment else []))]
    got = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)],
                                            request_timeout=timeout)[group].result()
    committed = {tp.partition: int(tp.offset) for tp in got.topic_partitions
                 if tp.topic == topic and tp.offset >= 0}
    if not committed and not members:
        return None
    lag = uncommitted = 0
    for p, (lo, hi) in marks.items():
        if p in committed:
            lag += max(0, hi - max(committed[p], lo))
        elif hi > lo:
            lag += hi - lo
            uncommitted += 1
    state = getattr(desc.state, "name", str(desc.state))
    return GroupLag(group, role, topic, state, len(members), lag, uncommitted)


def _latest_dead_letters(settings: Settings, topic: str, marks: Mapping[int, tuple[int, int]], n: int,
                         timeout: float) -> list[DeadLetterView]:
    """The newest ``n`` dead letters of every partition, newest first (read with an assigned,
    never-committing consumer)."""
    from confluent_kafka import Consumer, TopicPartition

    todo = {p: (max(lo, hi - n), hi) for p, (lo, hi) in marks.items() if hi > lo}
    if not todo:
        return []
    c = Consumer(settings.consumer_config(f"runlog-console-{uuid.uuid4().hex[:12]}",
                                          **{"enable.partition.eof": False}))
    out: list[DeadLetterView] = []
    try:
        c.assign([TopicPartition(topic, p, start) for p, (start, _) in todo.items()])
        left = {p: end for p, (_, end) in todo.items()}
        deadline = time.monotonic() + timeout
        while left and time.monotonic() < deadline:
            for m in c.consume(num_messages=500, timeout=0.5):
                if m.error() is not None:
                    continue
                p, off = m.partition(), m.offset()
                h = parse_headers(m.headers())
                out.append(DeadLetterView(p, off, m.timestamp()[1], h.get(H_REASON, "?"), h.get(H_DETAIL, ""),
                                          f"{h.get(H_TOPIC, '?')}[{h.get(H_PARTITION, '?')}]@"
                                          f"{h.get(H_OFFSET, '?')}"))
                if off >= left.get(p, 0) - 1:
                    left.pop(p, None)
    finally:
        c.close()
    out.sort(key=lambda d: (d.timestamp_ms, d.offset), reverse=True)
    return out[:n]


def read_health(settings: Settings, store: RedisStore, admin: Any, *, projector_groups: Iterable[str],
                timeout: float = 5.0, dead_letters_shown: int = 10) -> Health:
    """Lag of the projector group(s) on the events topic and of every resumer group
    (``<RUNLOG_RESUMER_GROUP>.*``) on the resume topic, dead letters, the projection marker.

    A part that cannot be read is reported in :attr:`Health.errors`; the others are still read.
    """
    from confluent_kafka import KafkaException

    names = Topics.of(settings)
    h = Health(read_at=int(time.time() * 1000))
    try:
        marker = store.marker()
        h.marker = "missing" if marker is None else marker.state
        h.rebuild_locked = store.rebuild_locked()
        h.counts = {s.value: n for s, n in store.counts().items()}
    except (RunlogError, redis.RedisError) as err:
        h.errors.append(f"redis: {err}")
    try:
        events = _watermarks(admin, names.events, timeout)
        for g in (settings.group_id(g) for g in projector_groups):  # the ids under the topic prefix
            lag = _group_lag(admin, g, "projector", names.events, events, timeout)
            h.groups.append(lag or GroupLag(g, "projector", names.events, "absent", 0,
                                            sum(hi - lo for lo, hi in events.values()),
                                            sum(hi > lo for lo, hi in events.values()),
                                            "no offsets and no members on this topic"))
        resume = _watermarks(admin, names.resume, timeout)
        listed = admin.list_consumer_groups(request_timeout=timeout).result()
        prefix = settings.group_id(settings.resumer_group + ".")
        for gid in sorted(g.group_id for g in listed.valid if g.group_id.startswith(prefix)):
            lag = _group_lag(admin, gid, "resumer", names.resume, resume, timeout)
            if lag is not None:
                h.groups.append(lag)
        dlq = _watermarks(admin, names.dlq, timeout)
        h.dead_letters = sum(hi - lo for lo, hi in dlq.values())
        h.latest_dead_letters = _latest_dead_letters(settings, names.dlq, dlq, dead_letters_shown, timeout)
    except (KafkaException, RunlogError) as err:
        h.errors.append(f"kafka: {err}")
    return h
