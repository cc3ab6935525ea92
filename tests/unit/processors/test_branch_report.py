"""What ``runlog branch`` prints is what the branch did, not its plan (issue 25): the stages it ran and
verified, where it blocked or failed and why, and the planned stages it never ran."""

from __future__ import annotations

import json
from typing import Any

from runlog.processors.branch import BranchResult

PLAN = ("quote", "reserve", "charge", "notify")


def _branch(**kw: Any) -> BranchResult:
    base: dict[str, Any] = dict(run_id="run-b", parent_run_id="run-p", forked_from_seq=7,
                                   first_affected_stage="quote", inherited_stages=("load",),
                                   rerun_stages=PLAN, completed=False)
    return BranchResult(**{**base, **kw})


def test_a_branch_blocked_at_charge_says_what_ran_where_it_blocked_and_what_never_ran() -> None:
    reason = "delivery key abc is in doubt in run run-p (charge pay/charge/0)"
    res = _branch(ran_stages=("quote", "reserve"), blocked_stage="charge", blocked_reason=reason)
    line = res.describe()
    assert line == ("branch run-b of run-p forked at seq 7: inherited load; ran and verified quote, reserve; "
                    f"BLOCKED in charge: {reason}; never ran notify; NOT completed")
    assert "re-ran" not in line and "charge, notify" not in line  # not the plan
    assert res.not_run_stages == ("notify",)
    doc = res.to_dict()
    assert json.loads(json.dumps(doc)) == doc
    assert (doc["ran_stages"], doc["not_run_stages"], doc["blocked_stage"], doc["rerun_stages"]) == (
        ["quote", "reserve"], ["notify"], "charge", list(PLAN))


def test_a_branch_blocked_in_its_first_stage_ran_no_stage() -> None:
    res = _branch(blocked_stage="quote", blocked_reason="in doubt")
    assert "; ran and verified no stage; BLOCKED in quote: in doubt; never ran reserve, charge, notify;" \
        in res.describe()


def test_a_failed_branch_says_which_stage_failed_and_why() -> None:
    res = _branch(ran_stages=("quote",), failed_stage="reserve", failed_reason="InputNotFound: no v9")
    line = res.describe()
    assert line.endswith("ran and verified quote; FAILED in reserve: InputNotFound: no v9; never ran charge, "
                         "notify; NOT completed")
    assert res.to_dict()["failed_stage"] == "reserve"


def test_a_completed_branch_ran_its_plan() -> None:
    res = _branch(ran_stages=PLAN, completed=True)
    assert res.describe().endswith("; ran and verified quote, reserve, charge, notify; completed")
    assert res.not_run_stages == ()


def test_a_branch_only_created_ran_nothing() -> None:
    res = _branch(executed=False)
    line = res.describe()
    assert "created, not executed" in line and "ran and verified" not in line
    assert res.to_dict()["executed"] is False
