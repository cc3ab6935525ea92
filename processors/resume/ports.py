"""The event-log port the resumer reads a run through, and its adapters (Kafka, in memory).

The resumer's other ports are the SDK's: the projection store
(:class:`runlog.projections.store.ProjectionStore`), the artifact store
(:class:`runlog.producers.calls._artifacts.ArtifactStore`), and the runner's lease manager and effects ledger
(:class:`runlog.producers.log._lease.LeaseManager`, :class:`runlog.producers.calls._ledger.EffectLedger`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from runlog.producers.internal import KafkaRunLog
from runlog.schemas import RunEvent
from runlog.schemas.settings import Settings

if TYPE_CHECKING:
    from runlog.producers.internal import InMemoryEventLog
    from runlog.projections.log_reader import LogReader
    from runlog.schemas import Codec

__all__ = ["KafkaRunEvents", "MemoryRunEvents", "RunEventReader"]


class RunEventReader(Protocol):
    """Reads one run's events back from the events topic."""

    def partition_of(self, run_id: str) -> int:
        """The partition the run's events are on."""
        ...

    def run_records(self, run_id: str, partition: int,
                    from_offset: int) -> Iterable[tuple[int, RunEvent, str]]:
        """The run's decodable events with their offsets and hashes (``runlog.schemas.event_hash`` of each
        from its record's bytes as stored: the fold's ``content_hash``), from ``from_offset`` to the
        end of the partition as it was when the read began."""
        ...


class KafkaRunEvents(KafkaRunLog):
    """The events topic on Kafka (:meth:`runlog.projections.log_reader.LogReader.run_records`).

    One reader (its consumer, assigned per read, never in a group) and one codec serve every read
    until :meth:`close`: a resume's tail of 20 events costs one watermark request and one fetch,
    not a new client's connection and a schema compilation each time. Reads are serialized (a
    lock); each returns the run's records as a list. A read that fails closes the reader: the next
    read opens a new one."""

    def __init__(self, settings: Settings, *, codec: Codec | None = None) -> None:
        super().__init__(settings)
        self.codec = codec
        self._reader: LogReader | None = None
        self._lock = threading.Lock()

    def run_records(self, run_id: str, partition: int,
                    from_offset: int) -> Iterable[tuple[int, RunEvent, str]]:
        from runlog.projections.log_reader import LogReader
        from runlog.schemas import Codec

        with self._lock:
            if self.codec is None:
                self.codec = Codec.from_settings(self.settings)
            if self._reader is None:
                self._reader = LogReader(self.settings, name="runlog-resume-read", fetch_wait_ms=5)
            try:
                out = list(self._reader.run_records(run_id, partition, from_offset, codec=self.codec))
                self._reader.consumer.unassign()  # no fetch in flight between reads
                return out
            except BaseException:
                self._close_reader()
                raise

    def _close_reader(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()

    def close(self) -> None:
        with self._lock:
            self._close_reader()


class MemoryRunEvents:
    """An :class:`~runlog.producers.log._memory.InMemoryEventLog` read as the events topic (unit tests)."""

    def __init__(self, log: InMemoryEventLog) -> None:
        self.log = log

    def partition_of(self, run_id: str) -> int:
        return self.log.partition_of(run_id)

    def run_records(self, run_id: str, partition: int,
                    from_offset: int) -> Iterable[tuple[int, RunEvent, str]]:
        return [(r.offset, r.event, r.hash) for r in self.log.records(run_id)
                if r.partition == partition and r.offset >= from_offset]
