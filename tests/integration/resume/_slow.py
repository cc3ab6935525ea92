"""A live worker for the cancel tests: one stage of slow tool calls, each counted where it starts.

``tick`` appends its number to a file as it starts, then sleeps ``delay`` seconds, so a test
sees which calls started and can act while the worker is inside one. Run as a process:
``python -m tests.integration.resume._slow --path FILE [--count N] [--delay S]`` prints
``run_id=<id>`` and executes one run; it exits 3 when it stops because its lease was lost
(``LeaseLost``), 0 when the run completed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from runlog.processors.resume import App
from runlog.producers import CallInfo, DictInputSource, Runner, StageContext, Workflow, tool
from runlog.schemas import LeaseLost, ReplayPolicy, Settings

ROOT = Path(__file__).resolve().parents[3]


@tool("tick", policy=ReplayPolicy.SAFE)
def tick(call: CallInfo, n: int, path: str, delay: float) -> Any:
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{n}\n")
    time.sleep(delay)
    return {"n": n}


def slow_app() -> App:
    wf = Workflow("slow", version="1")

    @wf.stage("ticks")
    def ticks(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        p = ctx.params
        return {"n": [ctx.call(tick, n=i, path=p["path"], delay=p["delay"])["n"] for i in range(p["count"])]}

    return App.of([wf], [tick], DictInputSource({}))


def started(path: Path) -> list[int]:
    """The numbers of the ``tick`` calls that started so far."""
    if not path.exists():
        return []
    return [int(x) for x in path.read_text(encoding="utf-8").split()]


def spawn(settings: Settings, path: Path, *, count: int = 5, delay: float = 3.0) -> subprocess.Popen[str]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RUNLOG_")}, **settings.to_env()}
    cmd = [sys.executable, "-m", "tests.integration.resume._slow", "--path", str(path), "--count", str(count),
           "--delay", str(delay)]
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="run one slow workflow")
    p.add_argument("--path", required=True)
    p.add_argument("--count", type=int, default=5)
    p.add_argument("--delay", type=float, default=3.0)
    a = p.parse_args(argv)
    app = slow_app()
    return run_and_report(Settings.from_env(), app, "slow", {"path": a.path, "count": a.count,
                                                              "delay": a.delay})


def run_and_report(settings: Settings, app: App, workflow: str, params: dict[str, Any]) -> int:
    """A worker process's life: start one run, print ``run_id=``, execute it, print how it ended
    (``lease_lost=`` exits 3, ``completed=`` exits 0 when completed, else 1)."""
    with Runner.from_settings(settings, source=app.source) as runner:
        handle = runner.start_run(app.registry.get(workflow), params)
        print(f"run_id={handle.run_id}", flush=True)
        assert handle.session is not None
        try:
            result = runner.execute(handle.session)
        except LeaseLost as err:
            print(f"lease_lost={err}", flush=True)
            return 3
    print(f"completed={result.completed}", flush=True)
    return 0 if result.completed else 1


if __name__ == "__main__":
    sys.exit(main())
