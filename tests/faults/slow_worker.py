"""A slow demo worker for the zombie-writer fault: every call to the demo world waits first.

Same as :mod:`runlog.processors.demo.worker` (prints ``run_id=<id>``, runs the content
workflow against ``RUNLOG_DEMO_WORLD_URL``) but each world request is delayed by
``--delay`` seconds, so a test can pause the process with SIGSTOP at a known
stage. Exits 3 when it stops because its lease was lost (``LeaseLost``).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from runlog.processors.demo.client import WorldClient
from runlog.processors.demo.pipeline import app_for
from runlog.schemas import Settings
from tests.integration.resume._slow import run_and_report


class SlowWorld(WorldClient):
    """A world client that sleeps before every request."""

    def __init__(self, base_url: str, delay_s: float) -> None:
        super().__init__(base_url)
        self.delay_s = delay_s

    def post(self, path: str, doc: dict[str, Any]) -> Any:
        time.sleep(self.delay_s)
        return super().post(path, doc)

    def get(self, path: str, **query: str) -> Any:
        time.sleep(self.delay_s)
        return super().get(path, **query)

    def upload(self, idempotency_key: str, data: bytes) -> Any:
        time.sleep(self.delay_s)
        return super().upload(idempotency_key, data)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="run one slow content workflow")
    p.add_argument("--delay", type=float, default=0.5)
    a = p.parse_args(argv)
    settings = Settings.from_env()
    application = app_for(SlowWorld(settings.demo_world_url or "", a.delay))
    return run_and_report(settings, application, "content", {"seed": 7})


if __name__ == "__main__":
    sys.exit(main())
