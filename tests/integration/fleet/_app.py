"""The fleet tests' App: a two-stage workflow whose one tool counts how many of its calls run at once
in this process (the worker's concurrency bound), importable by a ``runlog worker`` subprocess."""

from __future__ import annotations

import threading
import time
from typing import Any

from runlog.processors.resume import App
from runlog.producers import (
    CallInfo,
    DictInputSource,
    Queue,
    RateLimit,
    ReplayPolicy,
    Workflow,
    rule,
    tool,
)


class Overlap:
    """The most calls seen at once."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0
        self.lock = threading.Lock()

    def __enter__(self) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.now -= 1


OVERLAP = Overlap()


@tool("square", policy=ReplayPolicy.IDEMPOTENT)
def square(call: CallInfo, n: int, hold_s: float) -> Any:
    with OVERLAP:
        time.sleep(hold_s)
        return {"n2": n * n}


def workflow(version: str = "1") -> Workflow:
    wf = Workflow("squares", version)

    @wf.stage("square", rules=[rule("n2 >= 0", lambda out: out["n2"] >= 0)])
    def first(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return dict(ctx.call(square, n=int(ctx.params["n"]), hold_s=float(ctx.params.get("hold_s", 0.0))))

    @wf.stage("report")
    def report(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"text": f"{ctx.params['n']} squared is {ctx.output_of('square')['n2']}", "version": version}

    return wf


app = App.of([workflow("1")], [square], DictInputSource({}), name="fleet-tests")
app_v12 = App.of([workflow("1"), workflow("2")], [square], DictInputSource({}), name="fleet-tests")


class Gauge:
    """Calls running at once, overall and per tenant, and the most seen of each."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now: dict[str, int] = {}
        self.most: dict[str, int] = {}
        self.total = 0
        self.most_total = 0

    def reset(self) -> None:
        with self.lock:
            self.now, self.most, self.total, self.most_total = {}, {}, 0, 0

    def enter(self, tenant: str) -> None:
        with self.lock:
            self.now[tenant] = self.now.get(tenant, 0) + 1
            self.most[tenant] = max(self.most.get(tenant, 0), self.now[tenant])
            self.total += 1
            self.most_total = max(self.most_total, self.total)

    def leave(self, tenant: str) -> None:
        with self.lock:
            self.now[tenant] -= 1
            self.total -= 1


GAUGE = Gauge()


@tool("hold", policy=ReplayPolicy.IDEMPOTENT)
def hold(call: CallInfo, tenant: str, hold_s: float) -> Any:
    GAUGE.enter(tenant)
    try:
        time.sleep(hold_s)
    finally:
        GAUGE.leave(tenant)
    return {"tenant": tenant}


def fair_workflow() -> Workflow:
    wf = Workflow("fair", "1")

    @wf.stage("hold")
    def only(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return dict(ctx.call(hold, tenant=str(ctx.params["tenant"]), hold_s=float(ctx.params["hold_s"])))

    return wf


FAIR = Queue("fair", concurrency=4, per_tenant=2, weights={"c": 2})
app_fair = App.of([fair_workflow()], [hold], DictInputSource({}), name="fleet-fair", queues=[FAIR])


ASK_LIMIT = RateLimit("test:model", requests=2, per_s=8.0)
"""Two requests at once, one more every 4 s: a third call in a row waits 4 s, past the fleet's
default 2 s, so it waits durably."""


@tool("ask", policy=ReplayPolicy.SAFE, limit=ASK_LIMIT, estimate=lambda args: 0)
def ask(call: CallInfo, n: int, log: str) -> Any:
    with open(log, "a", encoding="utf-8") as f:  # every execution, from whichever process
        f.write(f"{call.run_id} {call.call_id}\n")
    return {"answer": n * 10}


def metered_workflow() -> Workflow:
    wf = Workflow("metered", "1")

    @wf.stage("ask")
    def asking(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"answers": [ctx.call(ask, n=i, log=str(ctx.params["log"]))["answer"] for i in range(3)]}

    return wf


app_limited = App.of([metered_workflow(), workflow("1")], [ask, square], DictInputSource({}),
                     name="fleet-limited")


def napping_workflow() -> Workflow:
    wf = Workflow("napper", "1")

    @wf.stage("nap")
    def nap(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        ctx.sleep(float(ctx.params["nap_s"]))  # durable past a second: the run lets go of its slot
        return dict(ctx.call(hold, tenant=str(ctx.params["tenant"]), hold_s=float(ctx.params["hold_s"])))

    return wf


SOLO = Queue("solo", concurrency=1)
app_solo = App.of([napping_workflow()], [hold], DictInputSource({}), name="fleet-solo", queues=[SOLO])
