"""What a writer needs to read back from the events topic: the first event of a run, and the run's
state as the log tells it.

The first event is read on the rare path of a run start that was interrupted (a run idempotency
key claimed, its ``RUN_STARTED`` maybe on the log, maybe not): the log, not Redis, says whether
the run exists. The state is read when a run is awaited and no projection has it
(:mod:`runlog.producers.run._outcome`). Each read costs one pass over the run's partition.
"""

from __future__ import annotations

import abc
import asyncio
import threading
from collections.abc import Generator, Iterable

from runlog.projections import RunState, fold_all
from runlog.schemas import RunEvent
from runlog.schemas.settings import Settings
from runlog.schemas.topics import Topics, partition_for

__all__ = ["InMemoryRunLog", "KafkaRunLog", "RunLog"]


class RunLog(abc.ABC):
    """The port."""

    @abc.abstractmethod
    def events(self, run_id: str) -> Iterable[RunEvent]:
        """The run's decodable events on the log, in log order."""

    def first_event(self, run_id: str) -> RunEvent | None:
        """The run's first decodable event on the log (the one the fold accepts as seq 1), or None."""
        return next(iter(self.events(run_id)), None)

    def state(self, run_id: str) -> RunState | None:
        """The run's state, folded from its events on the log; None when the log has none."""
        return fold_all(self.events(run_id))

    async def afirst_event(self, run_id: str) -> RunEvent | None:
        """:meth:`first_event` for an event loop: the sync read in a worker thread (a rare path)."""
        return await asyncio.to_thread(self.first_event, run_id)

    async def astate(self, run_id: str) -> RunState | None:
        """:meth:`state` for an event loop: the read in a worker thread."""
        return await asyncio.to_thread(self.state, run_id)


class InMemoryRunLog(RunLog):
    """Events kept in a list (unit tests); :meth:`append` is what a test writer calls."""

    def __init__(self) -> None:
        self.appended: list[RunEvent] = []
        self._lock = threading.Lock()

    def append(self, event: RunEvent) -> None:
        with self._lock:
            self.appended.append(event)

    def events(self, run_id: str) -> list[RunEvent]:
        with self._lock:
            return [e for e in self.appended if e.run_id == run_id]


class KafkaRunLog(RunLog):
    """Reads the run's partition of the events topic from the start."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topic = Topics.of(settings).events
        self._partitions: int | None = None

    def partition_of(self, run_id: str) -> int:
        if self._partitions is None:
            from runlog.schemas.internal import partitions_of

            self._partitions = partitions_of(self.settings, fallback=True)
        return partition_for(run_id, self._partitions)

    def events(self, run_id: str) -> Generator[RunEvent, None, None]:
        from runlog.projections.rebuild import run_events  # the one reader of a run's events

        for _, ev in run_events(self.settings, run_id, self.partition_of(run_id), 0):
            yield ev

    def first_event(self, run_id: str) -> RunEvent | None:
        events = self.events(run_id)
        try:
            return next(events, None)
        finally:
            events.close()  # a generator: closes its consumer
