"""Resumer group members on threads of their own, for the tests where members join and leave."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from runlog.processors.resume import App, ResumeOutcome, ResumerService
from runlog.schemas import Settings


class Member:
    """One ResumerService serving on a thread of its own until it leaves; what it raised."""

    def __init__(self, settings: Settings, app: App, name: str, done: list[ResumeOutcome]) -> None:
        self.name = name
        self.service = ResumerService(settings, app, on_outcome=done.append)
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, name=f"resumer-{name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.service.serve(stop=self.stop.is_set)
        except BaseException as err:  # noqa: BLE001 - the test reports it
            self.errors.append(err)

    def assigned(self) -> int:
        return len(self.service.partitions)  # the consumer belongs to the serving thread

    def leave(self) -> None:
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive(), f"member {self.name} did not stop"
        self.service.close()  # closes the consumer: it leaves the group


def until(cond: Callable[[], bool], what: str, members: Sequence[Member], timeout: float = 60,
          every: float = 0.05) -> None:
    """Wait for ``cond``; fail at once when one of ``members`` died (with what it raised)."""
    deadline = time.monotonic() + timeout
    while not cond():
        for m in members:
            assert not m.errors and m.thread.is_alive(), f"member {m.name} died: {m.errors!r}"
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(every)
