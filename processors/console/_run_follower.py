"""A run's page in the console, from the log: a :class:`RunFollower` feeds the run's records to the
audit's :class:`~runlog.processors.audit.checks.Auditor` (the one fold plus the audit's checks), so the
console's timeline is ``runlog audit``'s view of the run, and it keeps following the partition
from where it stopped (its own reader, assigned partitions, never committing);
:func:`timeline_items` groups the events into stage blocks as the audit page does."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from runlog.processors.audit import AuditOptions, Auditor, RunAudit
from runlog.processors.audit.html import KIND_CLASS, event_bits, event_classes
from runlog.processors.inspect import redact_text
from runlog.producers.internal import TEXT_PREFIX
from runlog.projections import RunState
from runlog.schemas import Codec, DecodeError, RunEvent, RunlogError, Settings, Topics

if TYPE_CHECKING:
    from runlog.projections.log_reader import LogReader

__all__ = ["SHOWN_ATTRIBUTES", "SHOWN_EVENTS", "RunFollower", "timeline_items"]

SHOWN_EVENTS = 1000
"""A run's page draws at most this many of its latest events."""

SHOWN_ATTRIBUTES = ("signal",)
"""Event attributes the timeline shows beside the audit's entry fields (which already carry an
operator's ``by``, ``why``, ``decision`` and ``action``)."""


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
        self.sealed: dict[int, dict[str, str]] = {}
        """The sealed texts of the run's events (``error``: kind and message, ``why``: an operator's
        reason), by offset: the audit's view shows them ``[sealed]``; :meth:`view` opens them for a
        signed-in reader."""
        self._reader: LogReader | None = None

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
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def poll(self, *, stall_s: float = 30.0) -> int:
        """Read what was appended since the last poll; how many of the run's events arrived.

        Raises:
            RunlogError: the topic cannot be read, or no progress for ``stall_s``.
        """
        from confluent_kafka import KafkaException

        from runlog.projections.log_reader import LogReader

        before = self.events
        try:
            if self._reader is None:
                self._reader = LogReader(self.settings, self.topic, name="runlog-console",
                                         poll_timeout=0.5)
            r = self._reader
            if self.partition is None:
                self.partition = r.partition_of(self.run_id)
            p = self.partition
            lo, hi = r.watermarks([p])[p]
            pos = max(lo, self.next_offset)
            self.next_offset = pos
            if pos >= hi:
                return 0
            key = self.run_id.encode("utf-8")
            for m in r.records({p: (pos, hi)}, stall_s=stall_s):
                self.auditor.feed(m.partition(), m.offset(), m.key(), m.value())
                if m.key() == key:
                    self._remember_attributes(m.offset(), m.value())
                self.next_offset = m.offset() + 1
            self.next_offset = hi  # what is left below it were transaction markers
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
        sealed = {}
        if ev.error is not None and ev.error.message.startswith(TEXT_PREFIX):
            sealed["error"] = f"{ev.error.kind}: {ev.error.message}"
        if ev.attributes.get("reason", "").startswith(TEXT_PREFIX):
            sealed["why"] = ev.attributes["reason"]
        if sealed:
            self.sealed[offset] = sealed

    def view(self, opener: Callable[[str], str] | None = None) -> dict[str, Any] | None:
        """The run as the audit report draws it (:meth:`RunAudit.to_dict`), with
        :data:`SHOWN_ATTRIBUTES` in its events, and only the latest :data:`SHOWN_EVENTS` events;
        ``opener`` (a signed-in reader's) opens the sealed texts the audit shows ``[sealed]``."""
        run = self.run
        if run is None:
            return None
        doc = run.to_dict()
        events = doc["events"]
        doc["hidden_events"] = max(0, len(events) - SHOWN_EVENTS)
        doc["events"] = [{**e, "attributes": self.shown.get(e["offset"], {}), **self._opened(e, opener)}
                         for e in events[-SHOWN_EVENTS:]]
        doc["next_offset"] = self.next_offset
        return doc

    def _opened(self, event: Mapping[str, Any], opener: Callable[[str], str] | None) -> dict[str, str]:
        """The sealed texts of ``event`` opened by ``opener`` (none without one)."""
        sealed = self.sealed.get(event["offset"]) if opener is not None else None
        if not sealed:
            return {}
        assert opener is not None
        out = {}
        if "error" in sealed:
            kind, _, message = sealed["error"].partition(": ")
            out["error"] = redact_text(f"{kind}: {opener(message)}")
        if "why" in sealed:
            out["why"] = redact_text(opener(sealed["why"]))
            if event.get("reason") == event.get("why"):
                out["reason"] = out["why"]
        return out


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
