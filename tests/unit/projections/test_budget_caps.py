"""Budget caps as the log records them: JSON round trip, raising some caps and keeping the others,
when a hard cap stops the next call, when a soft cap warns (once), and bad input refused."""

from __future__ import annotations

import pytest

from runlog.producers import Budget
from runlog.projections._budget import BudgetCaps
from runlog.projections._usage import UsageTotals
from runlog.schemas import WorkflowDefinitionError


def _spent(tokens_in: int, tokens_out: int, cost: int | None = None) -> UsageTotals:
    return UsageTotals(1, tokens_in, tokens_out, 0, 0, cost, 0 if cost is not None else 1)


def test_caps_round_trip_and_a_raise_keeps_the_caps_it_does_not_name() -> None:
    caps = Budget(tokens=2500, cost_usd=0.02, soft_tokens=2000, on_exceeded="fail").caps()
    assert caps == BudgetCaps(2500, 20_000_000, 2000, None, "fail")
    assert BudgetCaps.from_json(caps.to_json()) == caps
    raised = caps.raised({"tokens": "9000", "cost_nanos": ""})
    assert raised == BudgetCaps(9000, 20_000_000, 2000, None, "fail")
    with pytest.raises(ValueError):
        caps.raised({"tokens": "-1"})
    with pytest.raises(ValueError):
        BudgetCaps.from_json('["not", "a", "budget"]')


def _calls(n: int, tokens: int, cost: int | None = None) -> UsageTotals:
    return UsageTotals(n, tokens, 0, 0, 0, cost, 0 if cost is not None else n)


def test_a_call_that_would_pass_a_hard_cap_by_the_average_so_far_is_stopped() -> None:
    caps = BudgetCaps(tokens=1000, cost_nanos=5_000)
    assert caps.exceeded(UsageTotals()) is None  # no call yet: nothing to estimate from
    assert caps.exceeded(_calls(2, 600)) is None  # 600 + 300 <= 1000
    assert "token budget: 700 of 1000 tokens spent; the next call (about 350" in (
        caps.exceeded(_calls(2, 700)) or "")  # 700 + 350 > 1000
    assert caps.exceeded(_calls(2, 2, 3_000)) is None  # cost 3,000 + 1,500 <= 5,000
    assert "cost budget" in (caps.exceeded(_calls(2, 2, 3_400)) or "")  # 3,400 + 1,700 > 5,000
    assert caps.exceeded(_calls(2, 2, None)) is None  # unpriced calls: no cost to estimate


def test_a_soft_cap_warns_when_first_crossed() -> None:
    caps = BudgetCaps(soft_tokens=800)
    assert caps.soft_crossed(_spent(700, 0), _spent(800, 0)) == "tokens 800 >= soft cap 800"
    assert caps.soft_crossed(_spent(800, 0), _spent(900, 0)) is None  # already past: warned before
    assert BudgetCaps().exceeded(_spent(10**9, 10**9, 10**12)) is None  # no caps, no stop


def test_bad_budgets_are_refused_where_they_are_declared() -> None:
    for bad in ({"tokens": -5}, {"tokens": 1.5}, {"soft_tokens": True}, {"cost_usd": -0.01},
                {"on_exceeded": "ignore"}):
        with pytest.raises(WorkflowDefinitionError):
            Budget(**bad).caps()  # type: ignore[arg-type]
