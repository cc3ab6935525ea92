"""A session counts the delivery reports of its unconfirmed appends (one shared callback, no
per-append object): a flush waits for the events appended before it, and only for those, and
raises a failed delivery; a produce that raises leaves no flush waiting for its report."""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest

from runlog.producers.define._inputs import DictInputSource, PinnedInputs
from runlog.producers.define._workflow import Workflow
from runlog.producers.log._log import DeliveryCallback
from runlog.producers.log._memory import InMemoryEventLog, InMemoryLeaseManager
from runlog.producers.log._session import RunSession
from runlog.schemas import EventType, RunEvent
from runlog.schemas._tracecontext import TraceContext
from runlog.schemas.errors import DeliveryError
from runlog.schemas.settings import Settings


class HeldLog(InMemoryEventLog):
    """Stores each event at once but holds its delivery report until :meth:`report` is called."""

    def __init__(self) -> None:
        super().__init__(Settings.from_env({}))
        self.held: list[tuple[DeliveryCallback, int, int]] = []
        self.refuse_next = False

    def produce(self, event: RunEvent, on_delivery: DeliveryCallback,
                trace: TraceContext | None = None) -> str:
        if self.refuse_next:
            self.refuse_next = False
            raise ValueError("refused before anything was produced")
        return super().produce(event, lambda err, p, o: self.held.append((on_delivery, p, o)), trace)

    def report(self, n: int, error: DeliveryError | None = None) -> None:
        for cb, p, o in self.held[:n]:
            cb(error, p, o)
        del self.held[:n]


def _session(log: HeldLog) -> RunSession:
    run = f"run-{uuid.uuid4().hex}"
    return RunSession(log, InMemoryLeaseManager().acquire(run), run_id=run, next_seq=1,
                      workflow=Workflow("w", "1"), inputs=PinnedInputs(DictInputSource({}), {}), params={})


def _flush_in_thread(s: RunSession, timeout: float) -> tuple[threading.Thread, list[BaseException | None]]:
    out: list[BaseException | None] = []

    def run() -> None:
        try:
            s.flush(timeout)
            out.append(None)
        except BaseException as err:  # noqa: BLE001 - handed to the test
            out.append(err)

    t = threading.Thread(target=run)
    t.start()
    return t, out


def test_a_flush_waits_for_every_report_of_the_events_appended_before_it() -> None:
    log = HeldLog()
    s = _session(log)
    for i in range(3):
        s.append(EventType.STAGE_STARTED, stage=f"s{i}")
    with pytest.raises(DeliveryError, match="3 events not acknowledged"):
        s.flush(0.05)
    t, out = _flush_in_thread(s, 5)
    log.report(2)
    t.join(0.2)
    assert t.is_alive()  # one report still missing
    log.report(1)
    t.join(5)
    assert out == [None]


def test_a_flush_does_not_wait_for_events_appended_after_it_began() -> None:
    log = HeldLog()
    s = _session(log)
    s.append(EventType.STAGE_STARTED, stage="a")
    t, out = _flush_in_thread(s, 5)
    s.append(EventType.STAGE_STARTED, stage="b")  # after the flush began: not its to wait for
    log.report(1)
    t.join(5)
    assert out == [None] and len(log.held) == 1


def test_a_failed_report_is_raised_by_the_flush_and_every_later_append() -> None:
    log = HeldLog()
    s = _session(log)
    s.append(EventType.STAGE_STARTED, stage="a")
    s.append(EventType.STAGE_STARTED, stage="b")
    log.report(1, DeliveryError(log.topic, s.run_id, "MSG_TIMED_OUT: gone"))
    log.report(1)
    with pytest.raises(DeliveryError, match="MSG_TIMED_OUT"):
        s.flush(1)
    with pytest.raises(DeliveryError, match="MSG_TIMED_OUT"):
        s.append(EventType.STAGE_STARTED, stage="c")


def test_a_produce_that_raises_leaves_no_flush_waiting_for_it() -> None:
    log = HeldLog()
    s = _session(log)
    s.append(EventType.STAGE_STARTED, stage="a")
    t, out = _flush_in_thread(s, 5)
    log.report(1)
    t.join(5)
    assert out == [None]
    log.refuse_next = True
    with pytest.raises(ValueError, match="refused"):
        s.append(EventType.STAGE_STARTED, stage="b")
    s.flush(0.5)  # nothing outstanding: the refused event is not counted
    assert s.next_seq == 2


def test_an_awaited_flush_is_woken_by_the_last_report() -> None:
    log = HeldLog()
    s = _session(log)

    async def main() -> None:
        for i in range(5):
            await s.aappend(EventType.STAGE_STARTED, stage=f"s{i}")
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, log.report, 4)
        loop.call_later(0.1, log.report, 1)
        await asyncio.wait_for(s.aflush(5), 5)
        assert not log.held

    asyncio.run(main())
