"""Shared helpers of the producer integration tests: read a run's events with Runlog's log reader."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runlog.projections.log_reader import LogReader
from runlog.schemas import Codec, RunEvent, Settings
from runlog.schemas._kafka import watermarks as _watermarks


@dataclass(frozen=True)
class Read:
    event: RunEvent
    partition: int
    offset: int
    key: bytes


def read_events(settings: Settings, *, timeout: float = 30.0) -> list[Read]:
    """Every record of the events topic up to its current high watermarks, decoded with the schemas only."""
    codec = Codec()
    with LogReader(settings, name="t-read", stall_s=timeout) as r:
        return [Read(codec.decode(m.value(), RunEvent), m.partition(), m.offset(), m.key())
                for m in r.records(r.topic_ranges())]


def watermarks(consumer: Any, topic: str, partition: int, attempts: int = 20) -> tuple[int, int]:
    """Low and high watermark, waiting out a new topic's partition leader election
    (:func:`runlog.schemas._kafka.watermarks`, for about ``attempts`` half seconds)."""
    lo, hi = _watermarks(consumer, topic, [partition], timeout=max(10.0, attempts * 0.5))[partition]
    return int(lo), int(hi)


def events_of(reads: list[Read], run_id: str) -> list[Read]:
    """A run's records in log order (partition, offset)."""
    mine = [r for r in reads if r.event.run_id == run_id]
    return sorted(mine, key=lambda r: (r.partition, r.offset))
