"""One contract for every EventLog adapter: subclass it once per backend, provide ``log`` and ``read``."""

from __future__ import annotations

import asyncio
import threading
import uuid
from dataclasses import dataclass

from runlog.producers.define._inputs import DictInputSource, PinnedInputs
from runlog.producers.define._workflow import Workflow
from runlog.producers.log._log import EventLog
from runlog.producers.log._session import AppendResult, RunSession
from runlog.schemas import EventType, RunEvent, event_hash
from runlog.schemas._types import now_ms
from runlog.schemas.errors import DeliveryError
from runlog.schemas.topics import partition_for
from runlog.testing import InMemoryLeaseManager


@dataclass(frozen=True)
class Report:
    event: RunEvent
    error: DeliveryError | None
    partition: int
    offset: int


def event(run_id: str, seq: int, type: EventType = EventType.STAGE_STARTED) -> RunEvent:
    return RunEvent(run_id=run_id, seq=seq, epoch=1, type=type, occurred_at=now_ms(), stage=f"s{seq}")


class EventLogContract:
    log: EventLog

    def read(self, run_id: str, partition: int) -> list[tuple[int, int, RunEvent]]:
        """The run's stored events in log order as ``(partition, offset, event)``."""
        raise NotImplementedError

    def _append(self, ev: RunEvent, reports: list[Report], *, confirm: bool) -> threading.Event:
        done = threading.Event()

        def cb(err: DeliveryError | None, p: int, o: int) -> None:
            reports.append(Report(ev, err, p, o))
            done.set()

        self.log.produce(ev, cb)
        if confirm:
            assert self.log.send_now(done, 30.0), "a confirmed append was not acknowledged"
            assert done.is_set()
        return done

    def test_describes_itself(self) -> None:
        assert self.log.topic.endswith("runlog.events")
        assert self.log.writer_id and self.log.delivery_timeout_s > 0

    def _runs(self) -> list[str]:
        """Three new run ids, two of them on one partition (offsets are per partition, not per run)."""
        n = self.log.settings.partitions
        first = f"run-{uuid.uuid4().hex}"
        while True:
            second = f"run-{uuid.uuid4().hex}"
            if partition_for(second, n) == partition_for(first, n):
                return [first, second, f"run-{uuid.uuid4().hex}"]

    def test_confirmed_and_pipelined_events_of_several_runs_read_back_in_order(self) -> None:
        runs = self._runs()
        reports: list[Report] = []
        last: list[threading.Event] = []
        for run in runs:  # every run starts with a confirmed event
            self._append(event(run, 1, EventType.RUN_STARTED), reports, confirm=True)
        for seq in range(2, 7):  # then pipelined ones, interleaved across runs
            for run in runs:
                last.append(self._append(event(run, seq), reports, confirm=seq == 4))
        for done in last:
            assert self.log.send_now(done, 30.0)
        assert len(reports) == 18 and all(r.error is None for r in reports)
        positions = {(r.partition, r.offset) for r in reports}
        assert len(positions) == 18, "two events at one position"
        for run in runs:
            mine = sorted((r for r in reports if r.event.run_id == run), key=lambda r: r.event.seq)
            assert len({r.partition for r in mine}) == 1, "a run's events span partitions"
            offsets = [r.offset for r in mine]
            assert offsets == sorted(offsets) and len(set(offsets)) == 6, "not in produce order"
            got = self.read(run, mine[0].partition)
            assert [(p, o) for p, o, _ in got] == [(r.partition, r.offset) for r in mine]
            assert [e for _, _, e in got] == [r.event for r in mine]

    def test_a_session_appends_through_the_port_and_its_reports_match_the_log(self) -> None:
        wf = Workflow("w", "1")
        wf.stage("s")(lambda ctx, inputs: {})
        leases = InMemoryLeaseManager()
        run = f"run-{uuid.uuid4().hex}"
        s = RunSession(self.log, leases.acquire(run), run_id=run, next_seq=1, workflow=wf,
                       inputs=PinnedInputs(DictInputSource({}), {}), params={})
        first = s.append(EventType.RUN_STARTED, confirm=True, workflow=wf.spec(), input_versions={})
        assert first.partition >= 0 and first.offset >= 0
        second = s.append(EventType.STAGE_STARTED, stage="s")
        third = s.append(EventType.VERIFIED, stage="s")
        last = s.append(EventType.RUN_COMPLETED, confirm=True)
        s.close()
        got = self.read(run, first.partition)
        assert [e.seq for _, _, e in got] == [1, 2, 3, 4]
        assert [e.type for _, _, e in got] == [EventType.RUN_STARTED, EventType.STAGE_STARTED,
                                               EventType.VERIFIED, EventType.RUN_COMPLETED]
        assert (got[0][0], got[0][1]) == (first.partition, first.offset)
        assert (got[-1][0], got[-1][1]) == (last.partition, last.offset)
        assert got[1][2].prev_hash is not None and got[0][2].prev_hash is None  # the hash chain
        # version 2: each prev_hash is the hash the port computed from the bytes it produced
        appended = [first, second, third, last]
        assert {e.hash_version for _, _, e in got} == {2}
        assert [e.prev_hash for _, _, e in got] == [None, *(r.hash for r in appended[:-1])]
        assert all(r.hash == event_hash(r.event) for r in appended)  # this writer's schema: the same

    def test_awaited_appends_are_acknowledged_on_the_loop_in_seq_order(self) -> None:
        wf = Workflow("w", "1")
        wf.stage("s")(lambda ctx, inputs: {})
        leases = InMemoryLeaseManager()
        run = f"run-{uuid.uuid4().hex}"

        async def main() -> tuple[AppendResult, AppendResult]:
            s = RunSession(self.log, leases.acquire(run), run_id=run, next_seq=1, workflow=wf,
                           inputs=PinnedInputs(DictInputSource({}), {}), params={})
            first = await s.aappend(EventType.RUN_STARTED, confirm=True, workflow=wf.spec(),
                                    input_versions={})
            for i in range(20):  # unconfirmed appends: acknowledged by the awaited flush
                await s.aappend(EventType.STAGE_STARTED, stage=f"s{i}")
            last = await s.aappend(EventType.RUN_COMPLETED, confirm=True)
            await s.aclose()
            await self.log.arequest_resume(run, "contract test (awaited)")
            return first, last

        first, last = asyncio.run(main())
        assert first.partition >= 0 and first.offset >= 0 and last.offset > first.offset
        got = self.read(run, first.partition)
        assert [e.seq for _, _, e in got] == list(range(1, 23))
        assert (got[-1][0], got[-1][1]) == (last.partition, last.offset)

    def test_a_resume_request_is_acknowledged(self) -> None:
        self.log.request_resume(f"run-{uuid.uuid4().hex}", "contract test")
