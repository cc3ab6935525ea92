"""A demo worker process: starts one run of a demo workflow and executes it.

It prints ``run_id=<id>`` on its first line, then works. With ``RUNLOG_CRASH_AT``
set it SIGKILLs itself at that point (the crash points of :mod:`runlog.producers.crash`),
leaving the log exactly where a real crash would.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from runlog.processors.demo.pipeline import app
from runlog.producers import AsyncRunner, InputSource, Runner, Workflow
from runlog.producers.crash import arm_from_env
from runlog.schemas import Settings


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="run one demo workflow")
    p.add_argument("--workflow", default="content")
    p.add_argument("--params", default='{"seed": 7}', help="JSON object")
    p.add_argument("--input", action="append", default=[], metavar="NAME=VERSION")
    p.add_argument("--sdk", choices=["sync", "async"], default="sync",
                   help="run through the Runner (sync) or the AsyncRunner on an asyncio loop")
    a = p.parse_args(argv)
    arm_from_env()  # fault tests: RUNLOG_CRASH_AT
    settings = Settings.from_env()
    application = app()
    wf = application.registry.get(a.workflow)
    inputs = dict(i.split("=", 1) for i in a.input)
    params = json.loads(a.params)
    if a.sdk == "async":
        return asyncio.run(_run_async(settings, application.source, wf, params, inputs or None))
    with Runner.from_settings(settings, source=application.source) as runner:
        handle = runner.start_run(wf, params, inputs or None)
        print(f"run_id={handle.run_id}", flush=True)
        assert handle.session is not None
        result = runner.execute(handle.session)
    print(f"completed={result.completed}", flush=True)
    return 0 if result.completed else 1


async def _run_async(settings: Settings, source: InputSource, wf: Workflow, params: dict[str, Any],
                     inputs: dict[str, str] | None) -> int:
    async with AsyncRunner.from_settings(settings, source=source) as runner:
        handle = await runner.start_run(wf, params, inputs)
        print(f"run_id={handle.run_id}", flush=True)
        assert handle.session is not None
        result = await runner.execute(handle.session)
    print(f"completed={result.completed}", flush=True)
    return 0 if result.completed else 1


if __name__ == "__main__":
    sys.exit(main())
