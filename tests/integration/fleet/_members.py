"""In-process fleet members for the fleet tests."""

from __future__ import annotations

import threading

from runlog.processors.fleet import Taken, Worker
from runlog.processors.resume import ResumeOutcome
from runlog.producers import RunResult
from runlog.schemas import Settings

__all__ = ["_Member"]


class _Member:
    """A Worker serving on a thread of its own until it stops."""

    def __init__(self, settings: Settings, app: object, concurrency: int) -> None:
        self.taken: list[Taken] = []
        self.resumed: list[ResumeOutcome] = []
        self.results: dict[str, RunResult | BaseException] = {}
        self.worker = Worker(settings, app, concurrency=concurrency,  # type: ignore[arg-type]
                             on_taken=self.taken.append, on_outcome=self.resumed.append,
                             on_result=lambda r, x: self.results.__setitem__(r, x))
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            self.worker.serve(stop=self.stop.is_set)
        except BaseException as err:  # noqa: BLE001 - the test reports it
            self.errors.append(err)

    def leave(self) -> None:
        self.stop.set()
        self.thread.join(60)
        self.worker.close()
