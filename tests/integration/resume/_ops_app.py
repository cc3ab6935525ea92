"""The application ``tests/integration/resume/test_cli_operators.py`` names with ``--app``: a stage that
waits for the ``approval`` signal and returns what it got, and a stage whose second tool call fails
while ``FAIL`` holds an exception class (a ``runlog retry`` process imports this module afresh, with
``FAIL`` empty, so its retry succeeds)."""

from __future__ import annotations

from typing import Any

from runlog.processors.resume import App
from runlog.producers import CallInfo, DictInputSource, RetryPolicy, StageContext, Workflow, tool
from runlog.schemas import ReplayPolicy

FAIL: list[type[Exception] | None] = [None]
RUNS: set[str] = set()

approvals = Workflow("ops-approvals", version="1")


@approvals.stage("ask")
def ask(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
    return {"got": ctx.wait_for("approval")}


@tool("ops_prep", policy=ReplayPolicy.SAFE)
def prep(call: CallInfo) -> Any:
    RUNS.add(call.run_id)
    return {"v": 2}


@tool("ops_flaky", policy=ReplayPolicy.SAFE, retry=RetryPolicy(attempts=1))
def flaky(call: CallInfo, v: int) -> Any:
    if FAIL[0] is not None:
        raise FAIL[0]("the service said no")
    return {"w": v * 10}


flaky_wf = Workflow("ops-flaky", version="1")


@flaky_wf.stage("work")
def work(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
    return {"w": ctx.call(flaky, v=ctx.call(prep)["v"])["w"]}


app = App.of([approvals, flaky_wf], [prep, flaky], DictInputSource({}))
