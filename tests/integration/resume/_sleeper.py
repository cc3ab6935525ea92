"""A workflow that sleeps durably between two recorded calls, and its worker process: ``python -m
tests.integration.resume._sleeper SECONDS`` starts one run, prints ``run_id=...``, executes it until
it lets go of the run (``waiting=...``), then idles until it is killed."""

from __future__ import annotations

import sys
import time
from typing import Any

from runlog.processors.resume import App
from runlog.producers import CallInfo, DictInputSource, Runner, StageContext, Workflow, tool
from runlog.producers.crash import arm_from_env
from runlog.schemas import ReplayPolicy, Settings


@tool("stamp", policy=ReplayPolicy.SAFE)
def stamp(call: CallInfo, label: str) -> dict[str, Any]:
    return {"label": label, "at": time.time()}


def workflow() -> Workflow:
    wf = Workflow("sleeper", version="1")

    @wf.stage("nap")
    def nap(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        before = ctx.call(stamp, label="before")
        ctx.sleep(float(ctx.params["seconds"]))
        after = ctx.call(stamp, label="after")
        return {"slept": after["at"] - before["at"]}

    return wf


def app() -> App:
    return App.of([workflow()], [stamp], DictInputSource({}))


def main(argv: list[str]) -> int:
    arm_from_env()  # RUNLOG_CRASH_AT
    with Runner.from_settings(Settings.from_env()) as runner:
        handle = runner.start_run(workflow(), {"seconds": float(argv[0])})
        print(f"run_id={handle.run_id}", flush=True)
        assert handle.session is not None
        result = runner.execute(handle.session)
        print(f"waiting={result.waiting}", flush=True)
    time.sleep(600)  # the run's process lives on, holding nothing, until the test kills it
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
