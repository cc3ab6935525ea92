"""The Kafka run writer passes the shared event-log contract, read back with ``run_events``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from runlog.producers.log._writer import RunWriter
from runlog.projections.rebuild import run_events
from runlog.schemas import RunEvent, Settings
from tests.unit.producers.eventlog_contract import EventLogContract

pytestmark = pytest.mark.integration


class TestKafkaEventLog(EventLogContract):
    @pytest.fixture(autouse=True)
    def _log(self, topics: Settings) -> Iterator[None]:
        self.settings = topics
        self.log = RunWriter(topics)
        yield
        self.log.close()

    def read(self, run_id: str, partition: int) -> list[tuple[int, int, RunEvent]]:
        return [(partition, o, e) for o, e in run_events(self.settings, run_id, partition, 0)]
