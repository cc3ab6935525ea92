"""The event-log port the resumer reads a run through, and its adapters (Kafka, in memory).

The resumer's other ports are the SDK's: the projection store
(:class:`projections.store.ProjectionStore`), the artifact store
(:class:`producers.calls._artifacts.ArtifactStore`), and the runner's lease manager and effects ledger
(:class:`producers.run._lease.LeaseManager`, :class:`producers.calls._ledger.EffectLedger`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from producers.log._runlog import KafkaRunLog
from schemas._types import RunEvent
from schemas.settings import Settings

if TYPE_CHECKING:
    from producers.log._memory import InMemoryEventLog
    from schemas._codec import Codec

__all__ = ["KafkaRunEvents", "MemoryRunEvents", "RunEventReader"]


class RunEventReader(Protocol):
    """Reads one run's events back from the events topic."""

    def partition_of(self, run_id: str) -> int:
        """The partition the run's events are on."""
        ...

    def run_records(self, run_id: str, partition: int,
                    from_offset: int) -> Iterable[tuple[int, RunEvent, str]]:
        """The run's decodable events with their offsets and hashes (``schemas.event_hash`` of each
        from its record's bytes as stored: the fold's ``content_hash``), from ``from_offset`` to the
        end of the partition as it was when the read began."""
        ...


class KafkaRunEvents(KafkaRunLog):
    """The events topic on Kafka (:func:`projections.log_reader.read_run_records`)."""

    def __init__(self, settings: Settings, *, codec: Codec | None = None) -> None:
        super().__init__(settings)
        self.codec = codec

    def run_records(self, run_id: str, partition: int,
                    from_offset: int) -> Iterable[tuple[int, RunEvent, str]]:
        from projections.log_reader import read_run_records

        return read_run_records(self.settings, run_id, partition, from_offset, codec=self.codec)


class MemoryRunEvents:
    """An :class:`~producers.log._memory.InMemoryEventLog` read as the events topic (unit tests)."""

    def __init__(self, log: InMemoryEventLog) -> None:
        self.log = log

    def partition_of(self, run_id: str) -> int:
        return self.log.partition_of(run_id)

    def run_records(self, run_id: str, partition: int,
                    from_offset: int) -> Iterable[tuple[int, RunEvent, str]]:
        return [(r.offset, r.event, r.hash) for r in self.log.records(run_id)
                if r.partition == partition and r.offset >= from_offset]
