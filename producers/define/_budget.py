"""``Budget``: what a run's model calls may spend (:mod:`runlog.projections._budget` has the rules)."""

from __future__ import annotations

from dataclasses import dataclass

from runlog.projections.internal import ON_EXCEEDED, BudgetCaps
from runlog.schemas.errors import WorkflowDefinitionError

__all__ = ["Budget"]


def _nanos(usd: float | None, what: str) -> int | None:
    if usd is None:
        return None
    if usd < 0:
        raise WorkflowDefinitionError(f"Budget: {what} must not be negative, got {usd!r}")
    return round(usd * 1e9)


@dataclass(frozen=True)
class Budget:
    """Caps on a run's model calls: ``Workflow(..., budget=Budget(...))`` for every run of a workflow,
    or ``runner.start_run(..., budget=Budget(...))`` for one run (it wins over the workflow's).

    ``tokens`` / ``cost_usd``: hard caps (input plus output tokens; US dollars, priced by the App's
    ``prices``). A model call that would pass one (its spend estimated as the run's average per call
    so far) is not made: the run waits for a
    person to raise the cap (``runlog budget RUN --tokens N --by WHO --reason WHY``, an event on the
    log) when ``on_exceeded="wait"`` (the default), or fails when ``"fail"``. ``soft_tokens`` /
    ``soft_cost_usd``: a warning (an attribute of the call's ``TOOL_RESULT`` and the writer metric
    ``runlog_writer_budget_events_total{kind="soft"}``) when the spend first reaches them.
    What counts is the spend the log records: a resumed run counts its recorded calls once, so a run
    crashed at its cap and resumed does not spend past it."""

    tokens: int | None = None
    cost_usd: float | None = None
    soft_tokens: int | None = None
    soft_cost_usd: float | None = None
    on_exceeded: str = "wait"

    def __post_init__(self) -> None:
        if self.on_exceeded not in ON_EXCEEDED:
            raise WorkflowDefinitionError(f"Budget: on_exceeded must be one of {ON_EXCEEDED}, "
                                          f"got {self.on_exceeded!r}")
        for name in ("tokens", "soft_tokens"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise WorkflowDefinitionError(f"Budget: {name} must be a non-negative int, got {v!r}")

    def caps(self) -> BudgetCaps:
        """The caps as the log records them (cost in billionths of a dollar)."""
        return BudgetCaps(self.tokens, _nanos(self.cost_usd, "cost_usd"), self.soft_tokens,
                          _nanos(self.soft_cost_usd, "soft_cost_usd"), self.on_exceeded)
