"""Budgets: caps on what a run's model calls may spend, recorded on the log and folded into its state.

A budget (``runlog.producers.Budget``, per workflow or per run) is recorded at the run's start as the
``RUN_STARTED`` attribute :data:`BUDGET_ATTRIBUTE` (JSON, :meth:`BudgetCaps.to_json`); an operator
raises it with ``runlog budget RUN ...``, a ``SIGNAL_RECEIVED`` of signal :data:`BUDGET_SIGNAL` whose
attributes carry the new caps, who and why. What counts against the caps is the run's spend as the
fold sums it (:attr:`~runlog.projections.RunState.total_usage`: its own model calls, each once, and a
branch's inherited spend): a reused recorded call is not new spend.

* **Hard caps** (``tokens``: input plus output tokens; ``cost_nanos``): a model call that would pass
  a cap is not made (its spend estimated as the run's average per call so far,
  :meth:`BudgetCaps.exceeded`). The run then waits for a person (``on_exceeded="wait"``: ``RUN_WAITING``
  for signal :data:`BUDGET_SIGNAL`, until ``runlog budget`` raises the cap) or fails (``"fail"``).
* **Soft caps**: the result of the call whose spend first reaches one carries the attribute
  :data:`SOFT_ATTRIBUTE` (a warning on the log) and the writer counts it in
  ``runlog_budget_warnings_total``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from runlog.projections._usage import UsageTotals

__all__ = ["BUDGET_ATTRIBUTE", "BUDGET_SIGNAL", "ON_EXCEEDED", "SOFT_ATTRIBUTE", "BudgetCaps"]

BUDGET_ATTRIBUTE = "runlog.budget"
BUDGET_SIGNAL = "runlog.budget"
"""The signal a run waiting at a hard cap waits for; ``runlog budget`` sends it with the new caps."""
SOFT_ATTRIBUTE = "runlog.budget.soft"
ON_EXCEEDED = ("wait", "fail")
_CAPS = ("tokens", "cost_nanos", "soft_tokens", "soft_cost_nanos")


def _opt_int(v: Any) -> int | None:
    if v is None or v == "":
        return None
    n = int(v)
    if n < 0:
        raise ValueError(f"a budget cap must not be negative, got {v!r}")
    return n


@dataclass(frozen=True, slots=True)
class BudgetCaps:
    """A run's caps (None: no cap of that kind). ``cost_nanos`` in billionths of a US dollar."""

    tokens: int | None = None
    cost_nanos: int | None = None
    soft_tokens: int | None = None
    soft_cost_nanos: int | None = None
    on_exceeded: str = "wait"

    def __post_init__(self) -> None:
        if self.on_exceeded not in ON_EXCEEDED:
            raise ValueError(f"on_exceeded must be one of {ON_EXCEEDED}, got {self.on_exceeded!r}")

    def to_json(self) -> str:
        doc = {k: getattr(self, k) for k in _CAPS}
        return json.dumps({**doc, "on_exceeded": self.on_exceeded}, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> BudgetCaps:
        """Raises ValueError for anything that is not a budget."""
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise ValueError("a budget is a JSON object")
        t, c, st, sc = (_opt_int(doc.get(k)) for k in _CAPS)
        return cls(t, c, st, sc, str(doc.get("on_exceeded") or "wait"))

    def raised(self, attributes: dict[str, str] | Any) -> BudgetCaps:
        """These caps with those a budget signal's attributes set (``tokens``, ``cost_nanos``,
        ``soft_tokens``, ``soft_cost_nanos``: absent or empty keeps the cap)."""
        t, c, st, sc = (_opt_int(attributes[k]) if attributes.get(k) not in (None, "") else getattr(self, k)
                        for k in _CAPS)
        return BudgetCaps(t, c, st, sc, self.on_exceeded)

    # -- what the spend says ------------------------------------------------------------------------

    @staticmethod
    def _tokens(spent: UsageTotals) -> int:
        return spent.input_tokens + spent.output_tokens

    def exceeded(self, spent: UsageTotals) -> str | None:
        """Why the next model call may not be made, or None: it would pass a hard cap. What a call
        will spend is not known before it is made; the estimate is the run's average per call so far
        (tokens over its calls, cost over its priced calls; 0 before its first call), a function of
        the recorded totals alone, so a resumed run decides exactly as the uncrashed one would."""
        tokens = self._tokens(spent)
        if self.tokens is not None:
            est = -(-tokens // spent.calls) if spent.calls else 0
            if tokens + est > self.tokens:
                return (f"token budget: {tokens} of {self.tokens} tokens spent; the next call (about {est}, "
                        "the average so far) would pass it")
        priced = spent.calls - spent.unpriced_calls
        if self.cost_nanos is not None and spent.cost_nanos is not None and priced > 0:
            est = -(-spent.cost_nanos // priced)
            if spent.cost_nanos + est > self.cost_nanos:
                return (f"cost budget: ${spent.cost_nanos / 1e9:.6f} of ${self.cost_nanos / 1e9:.6f} spent; "
                        f"the next call (about ${est / 1e9:.6f}) would pass it")
        return None

    def soft_crossed(self, before: UsageTotals, after: UsageTotals) -> str | None:
        """The soft cap the spend reached between ``before`` and ``after`` (a warning), or None."""
        if self.soft_tokens is not None and self._tokens(before) < self.soft_tokens <= self._tokens(after):
            return f"tokens {self._tokens(after)} >= soft cap {self.soft_tokens}"
        if self.soft_cost_nanos is not None and (before.cost_nanos or 0) < self.soft_cost_nanos \
                <= (after.cost_nanos or 0):
            return f"cost ${(after.cost_nanos or 0) / 1e9:.6f} >= soft cap ${self.soft_cost_nanos / 1e9:.6f}"
        return None
