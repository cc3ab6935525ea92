"""A chaos worker process: starts one run of a chaos workflow and executes it, recording every append the
broker acknowledged (``run_id seq`` a line, in ``--acks``) so the count at the end can look for each on
the log.

It prints ``run_id=<id>`` on its first line, then works, and ``completed=<bool>`` when the runner
returns (a run that waits for a signal returns not completed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
from pathlib import Path
from typing import IO, Any

from runlog.processors.chaos.app import app
from runlog.producers import AsyncRunner, InputSource, Runner, Workflow
from runlog.producers.internal import DeliveryCallback, RunWriter
from runlog.schemas import DeliveryError, RunEvent, Settings
from runlog.schemas.internal import TraceContext

__all__ = ["AckRecorder", "main"]


class AckRecorder(RunWriter):
    """A run writer that appends ``run_id seq`` to a file for every event the broker acknowledged."""

    def __init__(self, settings: Settings, out: IO[str]) -> None:
        super().__init__(settings)
        self._out = out
        self._lock = threading.Lock()

    def produce(self, event: RunEvent, on_delivery: DeliveryCallback,
                trace: TraceContext | None = None) -> str:
        run_id, seq = event.run_id, event.seq

        def cb(err: DeliveryError | None, partition: int, offset: int) -> None:
            if err is None:
                with self._lock:
                    self._out.write(f"{run_id} {seq} {partition} {offset}\n")
                    self._out.flush()
            on_delivery(err, partition, offset)

        return super().produce(event, cb, trace)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="run one chaos workflow")
    p.add_argument("--workflow", default="content")
    p.add_argument("--params", default="{}", help="JSON object")
    p.add_argument("--sdk", choices=["sync", "async"], default="sync")
    p.add_argument("--acks", type=Path, required=True, help="file the acknowledged appends are added to")
    a = p.parse_args(argv)
    settings = Settings.from_env()
    application = app()
    wf = application.registry.get(a.workflow)
    params = json.loads(a.params)
    with open(a.acks, "a", encoding="utf-8") as out:
        writer = AckRecorder(settings, out)
        if a.sdk == "async":
            return asyncio.run(_run_async(settings, application.source, wf, params, writer))
        with Runner.from_settings(settings, source=application.source, writer=writer) as runner:
            handle = runner.start_run(wf, params)
            print(f"run_id={handle.run_id}", flush=True)
            assert handle.session is not None
            result = runner.execute(handle.session)
    print(f"completed={result.completed}", flush=True)
    return 0


async def _run_async(settings: Settings, source: InputSource, wf: Workflow, params: dict[str, Any],
                     writer: AckRecorder) -> int:
    async with AsyncRunner.from_settings(settings, source=source, writer=writer) as runner:
        handle = await runner.start_run(wf, params)
        print(f"run_id={handle.run_id}", flush=True)
        assert handle.session is not None
        result = await runner.execute(handle.session)
    print(f"completed={result.completed}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
