"""A demo worker that stops at a point of its run until the test has cut the network there.

Runs the content workflow against ``RUNLOG_DEMO_WORLD_URL`` like :mod:`runlog.processors.demo.worker`
and prints ``run_id=<id>``. With ``--pause-at POINT`` (a crash point of :mod:`runlog.producers.crash`)
it does not die there: it writes the point reached to ``DIR/reached`` and waits until ``DIR/go``
exists (the test has injected its fault), then goes on into the fault. Exits 0 when the run completed,
3 when it stopped because its lease was lost (``LeaseLost``: cut off from Redis past its lease, the
resumer took the run over), 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from runlog.processors.demo.client import WorldClient
from runlog.processors.demo.pipeline import app_for
from runlog.producers import crash
from runlog.schemas import Settings
from tests.integration.resume._slow import run_and_report


def pause_until(signals: Path, timeout_s: float = 120.0) -> Callable[[str], object]:
    def pause(point: str) -> None:
        (signals / "reached.tmp").write_text(point)
        (signals / "reached.tmp").replace(signals / "reached")
        deadline = time.monotonic() + timeout_s
        while not (signals / "go").exists():
            if time.monotonic() > deadline:
                raise SystemExit(f"the test did not open {signals / 'go'} in {timeout_s:.0f}s")
            time.sleep(0.02)
    return pause


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="run one content workflow, pausing at a point")
    p.add_argument("--pause-at", default=None)
    p.add_argument("--signals", type=Path, default=None, help="the directory of reached / go")
    a = p.parse_args(argv)
    if a.pause_at:
        assert a.signals is not None, "--pause-at needs --signals"
        crash.on_reach(pause_until(a.signals))
        crash.arm(a.pause_at)
    settings = Settings.from_env()
    application = app_for(WorldClient(settings.demo_world_url or ""))
    return run_and_report(settings, application, "content", {"seed": 7})


if __name__ == "__main__":
    sys.exit(main())
