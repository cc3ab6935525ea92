"""A run's budget as its writer checks it before each model call (:mod:`runlog.projections._budget`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runlog.projections.internal import BUDGET_SIGNAL, NO_USAGE, SOFT_ATTRIBUTE, BudgetCaps, UsageTotals
from runlog.schemas import EventType, Usage
from runlog.schemas.errors import TerminalToolError

if TYPE_CHECKING:
    from runlog.producers.base._protocol import Steps
    from runlog.producers.define._tools import Tool

__all__ = ["BudgetExceeded", "BudgetGuard", "CallBudget"]


class BudgetExceeded(TerminalToolError):
    """A model call was not made: the run's spend reached a hard cap of its budget (``on_exceeded``
    ``"fail"``)."""


class BudgetGuard:
    """A run's caps and its spend so far in this execution (from the log's totals at take-over, plus
    each call made since)."""

    def __init__(self, caps: BudgetCaps, spent: UsageTotals = NO_USAGE) -> None:
        self.caps = caps
        self.spent = spent
        self._lock = threading.Lock()

    def exceeded(self) -> str | None:
        with self._lock:
            return self.caps.exceeded(self.spent)

    def add_totals(self, totals: UsageTotals) -> str | None:
        """Count what a child run spent (recorded with its outcome); the soft cap it reached, or None."""
        with self._lock:
            before, self.spent = self.spent, self.spent.plus(totals)
            return self.caps.soft_crossed(before, self.spent)

    def add(self, usage: Usage) -> str | None:
        """Count one call's spend; the soft cap it reached (first time), or None."""
        with self._lock:
            before, self.spent = self.spent, self.spent.add(usage)
            return self.caps.soft_crossed(before, self.spent)


class CallBudget:
    """The budget's part of a stage context: the run's guard (on its session) checked before each model
    call and counting each made call's spend.

    Args:
        session: the run's session (its ``budget`` guard, its writer's metrics).
        fail: records the stage's failure (a refused call fails the stage).
    """

    def __init__(self, session: Any, fail: Callable[[BaseException], None]) -> None:
        self.session = session  # runlog.producers.log._session.RunSession (which names this module's guard)
        self._fail = fail

    def _count(self, kind: str) -> None:
        metrics = getattr(self.session.writer, "metrics", None)
        if metrics is not None:
            metrics.budget.labels(self.session.workflow.name, kind).inc()

    def check(self, tool: Tool, call_id: str, common: dict[str, Any]) -> Steps[None]:
        """Before a model call (a tool reporting usage) the run makes anew: refuse it once a hard cap
        is reached (the run waits for ``runlog budget``, or fails)."""
        from runlog.producers.calls._calls import RunWaits, error_info

        guard: BudgetGuard | None = getattr(self.session, "budget", None)  # sessions of tests may lack it
        why = guard.exceeded() if guard is not None and tool.usage is not None else None
        if guard is None or why is None:
            return
        s = self.session
        if guard.caps.on_exceeded == "fail":
            self._count("fail")
            err = BudgetExceeded(f"{call_id} not made: {why}", kind="BudgetExceeded")
            self._fail(err)
            yield from s.appending(EventType.FAILED, error=error_info(err), **common)
            raise err
        self._count("wait")
        attrs = {"signal": BUDGET_SIGNAL, "deadline_ms": "0", "on_timeout": "fail", "reason": why}
        yield from s.appending(EventType.RUN_WAITING, confirm=True, attributes=attrs, **common)
        raise RunWaits(s.run_id, call_id, BUDGET_SIGNAL, 0)

    def spent(self, usage: Usage | None) -> dict[str, str]:
        """Count a made call's spend; the ``TOOL_RESULT`` attribute of a soft cap it reached."""
        guard: BudgetGuard | None = getattr(self.session, "budget", None)  # sessions of tests may lack it
        if guard is None or usage is None:
            return {}
        warning = guard.add(usage)
        if warning is None:
            return {}
        self._count("soft")
        return {SOFT_ATTRIBUTE: warning}
