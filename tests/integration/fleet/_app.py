"""The fleet tests' App: a two-stage workflow whose one tool counts how many of its calls run at once
in this process (the worker's concurrency bound), importable by a ``runlog worker`` subprocess."""

from __future__ import annotations

import threading
import time
from typing import Any

from runlog.processors.resume import App
from runlog.producers import CallInfo, DictInputSource, ReplayPolicy, Workflow, rule, tool


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
