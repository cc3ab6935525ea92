"""The in-memory event log passes the shared contract, and injects delivery failures per run."""

from __future__ import annotations

import uuid

import pytest

from runlog.producers.define._inputs import DictInputSource, PinnedInputs
from runlog.producers.define._workflow import Workflow
from runlog.producers.log._session import RunSession
from runlog.schemas import EventType, RunEvent
from runlog.schemas.errors import DeliveryError
from runlog.testing import InMemoryEventLog, InMemoryLeaseManager

from .eventlog_contract import EventLogContract, event


class TestInMemoryEventLog(EventLogContract):
    @pytest.fixture(autouse=True)
    def _log(self) -> None:
        self.log = self.mem = InMemoryEventLog()

    def read(self, run_id: str, partition: int) -> list[tuple[int, int, RunEvent]]:
        got = [(r.partition, r.offset, r.event) for r in self.mem.records(run_id)]
        assert [e for _, _, e in got] == self.mem.events(run_id)
        assert all(p == partition for p, _, _ in got)
        return got

    def test_first_event_serves_the_run_log_port(self) -> None:
        assert self.mem.first_event("run-none") is None
        self.mem.produce(event("run-a", 1, EventType.RUN_STARTED), lambda *_: None)
        self.mem.produce(event("run-a", 2), lambda *_: None)
        first = self.mem.first_event("run-a")
        assert first is not None and first.seq == 1


def test_an_injected_failure_surfaces_as_delivery_error_from_the_session() -> None:
    log = InMemoryEventLog()
    wf = Workflow("w", "1")
    wf.stage("s")(lambda ctx, inputs: {})
    run = f"run-{uuid.uuid4().hex}"
    s = RunSession(log, InMemoryLeaseManager().acquire(run), run_id=run, next_seq=1, workflow=wf,
                   inputs=PinnedInputs(DictInputSource({}), {}), params={})
    s.append(EventType.RUN_STARTED, confirm=True, workflow=wf.spec(), input_versions={})
    log.fail_run(run, "broker said no")
    s.append(EventType.STAGE_STARTED, stage="s")  # pipelined: the failure shows at the next append
    with pytest.raises(DeliveryError, match="broker said no"):
        s.flush()
    with pytest.raises(DeliveryError):
        s.append(EventType.VERIFIED, stage="s")
    assert [e.seq for e in log.events(run)] == [1]
    log.heal_run(run)
    with pytest.raises(DeliveryError):  # the session stays refused: its seq has a gap
        s.append(EventType.VERIFIED, stage="s")
