"""A demo worker process: starts one run of a demo workflow and executes it.

It prints ``run_id=<id>`` on its first line, then works. With ``RUNLOG_CRASH_AT``
set it SIGKILLs itself at that point (the fault hook in :mod:`producers._crash`),
leaving the log exactly where a real crash would.
"""

from __future__ import annotations

import argparse
import json
import sys

from processors.demo.pipeline import app
from producers import Runner
from schemas import Settings


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="run one demo workflow")
    p.add_argument("--workflow", default="content")
    p.add_argument("--params", default='{"seed": 7}', help="JSON object")
    p.add_argument("--input", action="append", default=[], metavar="NAME=VERSION")
    a = p.parse_args(argv)
    settings = Settings.from_env()
    application = app()
    wf = application.registry.get(a.workflow)
    inputs = dict(i.split("=", 1) for i in a.input)
    with Runner.from_settings(settings, source=application.source) as runner:
        handle = runner.start_run(wf, json.loads(a.params), inputs or None)
        print(f"run_id={handle.run_id}", flush=True)
        assert handle.session is not None
        result = runner.execute(handle.session)
    print(f"completed={result.completed}", flush=True)
    return 0 if result.completed else 1


if __name__ == "__main__":
    sys.exit(main())
