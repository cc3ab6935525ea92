"""RunLog.afirst_event: the sync read, in a worker thread, so the event loop goes on meanwhile."""

from __future__ import annotations

import asyncio
import threading

from runlog.producers.log._memory import InMemoryEventLog
from runlog.producers.log._runlog import InMemoryRunLog
from runlog.schemas import EventType, RunEvent

from .eventlog_contract import event


class _SlowRunLog(InMemoryRunLog):
    """Records the thread each read ran on; a read blocks until released."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[threading.Thread] = []
        self.go = threading.Event()

    def first_event(self, run_id: str) -> RunEvent | None:
        self.threads.append(threading.current_thread())
        assert self.go.wait(5)
        return super().first_event(run_id)


def test_afirst_event_answers_like_first_event_for_both_in_memory_logs() -> None:
    mem, plain = InMemoryEventLog(), InMemoryRunLog()
    mem.produce(event("run-a", 1, EventType.RUN_STARTED), lambda *_: None)
    mem.produce(event("run-a", 2), lambda *_: None)
    plain.append(event("run-a", 1, EventType.RUN_STARTED))

    async def main() -> None:
        for log in (mem, plain):
            assert await log.afirst_event("run-none") is None
            first = await log.afirst_event("run-a")
            assert first is not None and first == log.first_event("run-a") and first.seq == 1

    asyncio.run(main())


def test_afirst_event_reads_off_the_loop_thread() -> None:
    log = _SlowRunLog()
    log.append(event("run-a", 1, EventType.RUN_STARTED))

    async def main() -> None:
        read = asyncio.create_task(log.afirst_event("run-a"))
        ticks = 0
        while not log.threads:  # the loop keeps running while the read blocks
            await asyncio.sleep(0.01)
        for _ in range(3):
            await asyncio.sleep(0.01)
            ticks += 1
        assert not read.done() and ticks == 3
        log.go.set()
        first = await read
        assert first is not None and first.seq == 1
        assert log.threads[0] is not threading.main_thread()

    asyncio.run(main())
