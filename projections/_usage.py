"""What a run spent, as the fold counts it (pure: no I/O).

Spend is a fact on the log: a model call's tokens and cost are recorded once, with its
``TOOL_RESULT`` (:attr:`runlog.schemas.RunEvent.usage`). The fold adds each accepted one to the run's
totals, its stage's and its model's, so the totals are a function of the accepted events alone:

* a resume, a retry or a replay hands recorded results back without appending them again, so a
  reused call adds nothing; a call made again (it had no recorded result) is new spend;
* a duplicate or a redelivered record is not accepted twice, and a rebuild of the projection
  from the log folds the same events to the same totals;
* a child run's spend reaches its parent once, with its outcome (attribute ``runlog.usage.child``
  of the event recording it): the parent keeps it apart (:attr:`RunState.children_usage`) and counts
  it in its totals and against its budget from then on;
* a branch is a new run: its ``RUN_BRANCHED`` carries its parent's totals at the fork (attribute
  ``runlog.usage.inherited``, written by ``runlog branch``), kept apart from what the branch
  spends itself (:attr:`RunState.inherited_usage`, :attr:`RunState.usage`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from runlog.schemas import Usage

__all__ = ["CHILD_USAGE_ATTRIBUTE", "INHERITED_ATTRIBUTE", "NO_USAGE", "UsageTotals", "inherited_from",
           "totals_from"]

INHERITED_ATTRIBUTE = "runlog.usage.inherited"
"""The ``RUN_BRANCHED`` attribute holding the parent's totals at the fork (:meth:`UsageTotals.to_json`)."""
CHILD_USAGE_ATTRIBUTE = "runlog.usage.child"
"""The attribute of the event recording a child run's outcome on its parent's log (``TOOL_RESULT`` or
``SIGNAL_RECEIVED`` of the ``runlog.child`` call) holding what the child spent in all, its own
children's included (:meth:`UsageTotals.to_json`): recorded once, with the outcome, so a resume, a
replay or a rebuild of the parent never counts it twice."""


@dataclass(frozen=True, slots=True)
class UsageTotals:
    """Tokens and cost summed over model calls. ``cost_nanos`` sums the calls that had a price
    (billionths of a US dollar), None when none had one; ``unpriced_calls`` counts the calls whose
    model had no price (their tokens are counted, their cost is not known)."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_nanos: int | None = None
    unpriced_calls: int = 0

    def add(self, u: Usage) -> UsageTotals:
        """These totals with one more call's usage."""
        cost = self.cost_nanos
        if u.cost_nanos is not None:
            cost = (cost or 0) + u.cost_nanos
        return UsageTotals(self.calls + 1, self.input_tokens + u.input_tokens,
                           self.output_tokens + u.output_tokens, self.cache_read_tokens + u.cache_read_tokens,
                           self.cache_write_tokens + u.cache_write_tokens, cost,
                           self.unpriced_calls + (u.cost_nanos is None))

    def plus(self, other: UsageTotals | None) -> UsageTotals:
        """The sum of two totals."""
        if other is None:
            return self
        costs = [c for c in (self.cost_nanos, other.cost_nanos) if c is not None]
        return UsageTotals(self.calls + other.calls, self.input_tokens + other.input_tokens,
                           self.output_tokens + other.output_tokens,
                           self.cache_read_tokens + other.cache_read_tokens,
                           self.cache_write_tokens + other.cache_write_tokens,
                           sum(costs) if costs else None, self.unpriced_calls + other.unpriced_calls)

    @property
    def cost(self) -> float | None:
        """The cost in US dollars (None: no call had a price)."""
        return None if self.cost_nanos is None else self.cost_nanos / 1e9

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def to_dict(self) -> dict[str, Any]:
        """As ``runlog show --json`` and the console give it (``cost_usd`` beside ``cost_nanos``)."""
        return {"calls": self.calls, "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "cache_read_tokens": self.cache_read_tokens, "cache_write_tokens": self.cache_write_tokens,
                "cost_nanos": self.cost_nanos, "cost_usd": self.cost, "unpriced_calls": self.unpriced_calls}

    def to_json(self) -> str:
        """The canonical JSON of the counts (the ``RUN_BRANCHED`` attribute)."""
        d = self.to_dict()
        d.pop("cost_usd")
        return json.dumps(d, separators=(",", ":"), sort_keys=True)

    def describe(self) -> str:
        """One line: ``1,234 in (1,000 cached) / 56 out over 3 calls, $0.0123`` (and how many had
        no price)."""
        cached = f" ({self.cache_read_tokens:,} cached)" if self.cache_read_tokens else ""
        line = (f"{self.input_tokens:,} in{cached} / {self.output_tokens:,} out over {self.calls} "
                f"call{'s' if self.calls != 1 else ''}")
        if self.cost_nanos is not None:
            line += f", ${self.cost_nanos / 1e9:.6f}".rstrip("0").rstrip(".")
        if self.unpriced_calls:
            line += f", {self.unpriced_calls} without a price"
        return line


NO_USAGE = UsageTotals()
"""Nothing spent."""


def inherited_from(attributes: Any) -> UsageTotals | None:
    """The totals a ``RUN_BRANCHED`` event's attributes carry (None without them or when malformed:
    the fold never fails on an event)."""
    return totals_from(attributes, INHERITED_ATTRIBUTE)


def totals_from(attributes: Any, name: str) -> UsageTotals | None:
    """The totals attribute ``name`` of an event carries (None without it or when malformed)."""
    raw = attributes.get(name) if hasattr(attributes, "get") else None
    if not raw:
        return None
    try:
        d = json.loads(raw)
        ints = [d.get(k, 0) for k in ("calls", "input_tokens", "output_tokens", "cache_read_tokens",
                                      "cache_write_tokens", "unpriced_calls")]
        cost = d.get("cost_nanos")
    except (ValueError, AttributeError):
        return None
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in ints):
        return None
    if cost is not None and (isinstance(cost, bool) or not isinstance(cost, int) or cost < 0):
        return None
    calls, i, o, r, w, unpriced = ints
    return UsageTotals(calls, i, o, r, w, cost, unpriced)
