"""What starting and executing a run give back: :class:`RunResult` and :class:`RunHandle`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from runlog.producers.log._session import RunSession

__all__ = ["Outcomes", "RunHandle", "RunResult"]


@dataclass(frozen=True)
class RunResult:
    """The end of :meth:`Runner.execute`: outputs of every verified stage by name."""

    run_id: str
    epoch: int
    last_seq: int
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    completed: bool = False
    waiting: str | None = None
    """The signal the run waits for (``ctx.wait_for``): the run was let go, a signal resumes it."""


class Outcomes(Protocol):
    """Where a handle asks for its run's outcome (:class:`~runlog.producers.run._outcome.RunOutcomes`)."""

    def result(self, run_id: str, timeout: float | None = None, *,
               settle_on_wait: bool = False) -> RunResult: ...

    async def aresult(self, run_id: str, timeout: float | None = None, *,
                      settle_on_wait: bool = False) -> RunResult: ...


@dataclass(frozen=True)
class RunHandle:
    """What :meth:`Runner.start_run` returns. ``session`` is None when the idempotency key
    named an existing run (``created`` False): this process does not own that run, and
    :meth:`result` waits for its outcome wherever it executes."""

    run_id: str
    created: bool
    params_hash: str
    session: RunSession | None = None
    outcomes: Outcomes | None = field(default=None, compare=False, repr=False)

    def result(self, timeout: float | None = None) -> RunResult:
        """The run's outcome once it has ended, wherever it executes: its :class:`RunResult` when it
        completed (the outputs of every verified stage).

        Raises:
            RunFailed: it failed. ResumeBlocked: it is blocked (the reason says what a person must
                do). RunCancelled: an operator cancelled it. TimeoutError: it had not ended within
                ``timeout`` seconds (it goes on; ask again).
        """
        return self._outcomes().result(self.run_id, timeout)

    async def aresult(self, timeout: float | None = None) -> RunResult:
        """:meth:`result`, awaited (the waiting happens off the event loop)."""
        return await self._outcomes().aresult(self.run_id, timeout)

    def _outcomes(self) -> Outcomes:
        if self.outcomes is None:
            raise RuntimeError("this handle was built by hand: a Runner's start_run gives one that waits")
        return self.outcomes
