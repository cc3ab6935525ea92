"""A slow demo worker for the zombie-writer fault: every call to the demo world waits first.

Same as :mod:`runlog.processors.demo.worker` (prints ``run_id=<id>``, runs the content
workflow against ``RUNLOG_DEMO_WORLD_URL``) but each world request is delayed by
``--delay`` seconds, so a test can pause the process with SIGSTOP at a known
stage. Exits 3 when it stops because its lease was lost (``LeaseLost``).

With ``--gate FILE`` its world request number ``--gate-at`` (0: the first) waits until FILE exists:
the run is certainly still active (its lease held, its heartbeat going) until the test opens the gate,
whatever the machine's load.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from runlog.processors.demo.client import WorldClient
from runlog.processors.demo.pipeline import app_for
from runlog.schemas import Settings
from tests.integration.resume._slow import run_and_report


class SlowWorld(WorldClient):
    """A world client that sleeps before every request."""

    def __init__(self, base_url: str, delay_s: float, gate: Path | None = None, gate_at: int = 1,
                 gate_timeout_s: float = 300.0) -> None:
        super().__init__(base_url)
        self.delay_s = delay_s
        self.gate, self.gate_at, self.gate_timeout_s = gate, gate_at, gate_timeout_s
        self.requests = 0

    def _before(self) -> None:
        if self.gate is not None and self.requests == self.gate_at:
            deadline = time.monotonic() + self.gate_timeout_s
            while not self.gate.exists():
                if time.monotonic() > deadline:
                    raise SystemExit(f"the gate {self.gate} was not opened in {self.gate_timeout_s:.0f}s")
                time.sleep(0.05)
        self.requests += 1
        time.sleep(self.delay_s)

    def post(self, path: str, doc: dict[str, Any]) -> Any:
        self._before()
        return super().post(path, doc)

    def get(self, path: str, **query: str) -> Any:
        self._before()
        return super().get(path, **query)

    def upload(self, idempotency_key: str, data: bytes) -> Any:
        self._before()
        return super().upload(idempotency_key, data)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="run one slow content workflow")
    p.add_argument("--delay", type=float, default=0.5)
    p.add_argument("--gate", type=Path, default=None, help="a file whose existence opens the gate")
    p.add_argument("--gate-at", type=int, default=1, help="the world request (0: the first) that waits")
    a = p.parse_args(argv)
    settings = Settings.from_env()
    application = app_for(SlowWorld(settings.demo_world_url or "", a.delay, a.gate, a.gate_at))
    return run_and_report(settings, application, "content", {"seed": 7})


if __name__ == "__main__":
    sys.exit(main())
