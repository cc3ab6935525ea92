"""``runlog worker``: one process of a fleet that starts submitted runs and resumes the runs nobody
continues.

A :class:`Worker` is a member of the App's resumer group (:class:`~runlog.processors.resume.ResumerService`:
resume requests, the sweep of dead runs, the versions it serves) and of the group's intake
(:class:`~runlog.processors.fleet._intake.SubmissionIntake`: submitted runs, at most ``concurrency``
executing at once). Each serves on a thread of its own; both stop together.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from runlog.processors.fleet._intake import IntakeMetrics, SubmissionIntake, Taken
from runlog.processors.resume import App, ResumeOutcome, ResumerService
from runlog.producers import RunResult
from runlog.schemas import Settings

__all__ = ["Worker"]

log = logging.getLogger("runlog.worker")


class Worker:
    """Resumes and submitted runs for ``app`` (the module docstring).

    Args:
        concurrency: submitted runs executing at once in this process.
        on_outcome: each resume's outcome; ``on_taken``: each submission taken; ``on_result``: each
            executed submitted run's result or error.
        metrics_port: serve the resumer's and the intake's metrics on ``GET /metrics`` (0: a free port).
    """

    def __init__(self, settings: Settings, app: App, *, concurrency: int = 4,
                 on_outcome: Callable[[ResumeOutcome], None] | None = None,
                 on_taken: Callable[[Taken], None] | None = None,
                 on_result: Callable[[str, RunResult | BaseException], None] | None = None,
                 metrics_port: int | None = None) -> None:
        self.service = ResumerService(settings, app, on_outcome=on_outcome, metrics_port=metrics_port)
        try:
            self.intake = SubmissionIntake(settings, app, group=self.service.group, concurrency=concurrency,
                                           metrics=IntakeMetrics(self.service.metrics.registry),
                                           on_taken=on_taken, on_result=on_result)
        except BaseException:
            self.service.close()
            raise
        self.service.resumer.gate = self.intake.admit  # a queued run's resumes take a slot of its queue
        self.errors: list[BaseException] = []

    def serve(self, *, stop: Callable[[], bool] | None = None) -> int:
        """Serve until ``stop()`` (or until one part fails: the other stops too and the error is
        raised); returns how many submitted runs this worker started."""
        failed = threading.Event()

        def stopping() -> bool:
            return failed.is_set() or (stop is not None and stop())

        def resumes() -> None:
            try:
                self.service.serve(stop=stopping)
            except BaseException as err:  # noqa: BLE001 - raised from serve() below
                self.errors.append(err)
                failed.set()

        t = threading.Thread(target=resumes, name="runlog-resumer", daemon=True)
        t.start()
        try:
            started = self.intake.serve(stop=stopping)
        except BaseException:
            failed.set()
            raise
        finally:
            t.join(60)
        if self.errors:
            raise self.errors[0]
        return started

    def close(self, wait: bool = True) -> None:
        """Leave both groups; with ``wait``, let the submitted runs executing finish first."""
        try:
            self.intake.close(wait=wait)
        finally:
            self.service.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
