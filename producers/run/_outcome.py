"""A run's outcome, awaited wherever the run executes: :meth:`RunHandle.result`.

A run started with an idempotency key that names an existing run belongs to whoever executes it
(its first starter, a resumer after a crash, a worker): the caller gets a handle, and the handle
waits for the run's end. Where the run stands is read from the Redis projection when it holds the
run, and from the log itself (a fold of the run's events) when it does not, and at least every
``log_every_s`` while the projection says the run goes on: a projector that stopped cannot keep a
waiter waiting. The outcome is the run's, as the log tells it:

* ``COMPLETED``: a :class:`RunResult` with the outputs of every verified stage;
* ``FAILED``: :class:`~runlog.schemas.errors.RunFailed` (the stage's error);
* ``BLOCKED``: :class:`~runlog.schemas.errors.ResumeBlocked` (the reason a person must act on);
* ``CANCELLED``: :class:`~runlog.schemas.errors.RunCancelled`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from runlog.producers.calls._artifacts import ArtifactStore
from runlog.producers.log._runlog import RunLog
from runlog.producers.run._results import RunResult
from runlog.projections import RunState, RunStatus
from runlog.schemas import ResumeBlocked, RunCancelled, RunFailed

__all__ = ["ENDED", "RunOutcomes"]

#: the statuses a run does not leave by itself (``runlog retry`` or ``resolve`` may move it on)
ENDED = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.BLOCKED, RunStatus.CANCELLED})


class RunOutcomes:
    """Reads where runs stand and waits for their end (see the module docstring).

    ``projected``: the run's projected state, None when the projection does not hold it (the
    Redis store's ``load_state``); ``run_log``: the log, folded when the projection lacks the run;
    ``artifacts``: where the stage outputs are read from."""

    def __init__(self, run_log: RunLog | None, artifacts: ArtifactStore, *,
                 projected: Callable[[str], RunState | None] | None = None, log_every_s: float = 5.0,
                 poll_s: tuple[float, float] = (0.05, 0.5)) -> None:
        self.run_log = run_log
        self.artifacts = artifacts
        self.projected = projected
        self.log_every_s = log_every_s
        self.poll_s = poll_s

    def state(self, run_id: str, *, from_log: bool = False) -> RunState | None:
        """The run's state: the projection's, else (or with ``from_log``) the log's."""
        state = None if from_log or self.projected is None else self.projected(run_id)
        if state is None and self.run_log is not None:
            state = self.run_log.state(run_id)
        return state

    def wait(self, run_id: str, timeout: float | None = None, *, settle_on_wait: bool = False) -> RunState:
        """The run's state once it has ended (with ``settle_on_wait``, also once it waits for a
        signal).

        Raises:
            TimeoutError: not so within ``timeout`` seconds.
        """
        start = time.monotonic()
        pause, log_read = self.poll_s[0], start
        state = self.state(run_id)
        while True:
            waits = settle_on_wait and state is not None and state.waiting is not None
            if state is not None and (state.status in ENDED or waits):
                return state
            now = time.monotonic()
            if timeout is not None and now - start >= timeout:
                where = state.status.value if state is not None else "not on the log"
                raise TimeoutError(f"run {run_id} has not ended after {timeout:g} s (it is {where})")
            time.sleep(min(pause, timeout - (now - start)) if timeout is not None else pause)
            pause = min(pause * 2, self.poll_s[1])
            from_log = time.monotonic() - log_read >= self.log_every_s
            if from_log:
                log_read = time.monotonic()
            state = self.state(run_id, from_log=from_log)

    def result(self, run_id: str, timeout: float | None = None, *, settle_on_wait: bool = False) -> RunResult:
        """The run's outcome (module docstring): its :class:`RunResult`, or its typed error."""
        return self.outcome(self.wait(run_id, timeout, settle_on_wait=settle_on_wait))

    async def aresult(self, run_id: str, timeout: float | None = None, *,
                      settle_on_wait: bool = False) -> RunResult:
        """:meth:`result` for an event loop: the reads and waits in a worker thread."""
        return await asyncio.to_thread(self.result, run_id, timeout, settle_on_wait=settle_on_wait)

    def outcome(self, state: RunState) -> RunResult:
        """What an ended (or waiting) run's state means to its caller.

        Raises:
            RunFailed: the run failed. ResumeBlocked: it is blocked. RunCancelled: it was cancelled.
        """
        error = state.last_error
        message = self.artifacts.open_text(error.message) if error else ""  # sealed with encryption on
        if state.status is RunStatus.FAILED:
            raise RunFailed(state.run_id, error.kind if error else "unknown", message,
                            error.retryable if error else False)
        if state.status is RunStatus.BLOCKED:
            raise ResumeBlocked(state.run_id, message if error else "blocked")
        if state.status is RunStatus.CANCELLED:
            raise RunCancelled(state.run_id, message if error else "cancelled")
        outputs: dict[str, dict[str, Any]] = {
            stage: json.loads(self.artifacts.get(ref)) for stage, ref in state.stage_outputs.items()}
        return RunResult(state.run_id, state.epoch, state.last_seq, outputs,
                         completed=state.status is RunStatus.COMPLETED,
                         waiting=state.waiting.signal if state.waiting is not None else None)
