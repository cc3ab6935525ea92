"""Worker processes of the test workflows (``_orders``, ``_pydantic_ai_agent``): one run each in a
child process, with the settings in its environment and, when asked, a crash point armed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from runlog.schemas.settings import Settings
from tests._fork import ForkedWorker, start

Worker = ForkedWorker | subprocess.Popen[str]

ROOT = Path(__file__).resolve().parents[3]
"""The repository root (not imported from ``tests.conftest``: a worker process has no use for pytest,
and importing it costs each of the fault suite's hundreds of worker processes a second of start-up)."""

__all__ = ["Worker", "finish", "resume_after_crash", "spawn_worker"]


def spawn_worker(module: str, args: list[str], settings: Settings, *, crash_at: str | None = None,
                 env: dict[str, str] | None = None) -> Worker:
    """``python -m module args`` from the repository root, with ``settings`` (and ``env``) in its
    environment and ``RUNLOG_CRASH_AT`` set to ``crash_at`` (removed when None); forked from the
    test process's fork server (:mod:`tests._fork`)."""
    full = {**os.environ, **settings.to_env(), **(env or {})}
    full.pop("RUNLOG_CRASH_AT", None)
    if crash_at:
        full["RUNLOG_CRASH_AT"] = crash_at
    return start(module, args, full, ROOT)


def finish(proc: Worker, log: Path, timeout_s: float = 120) -> tuple[int, str]:
    """Wait for a worker (killed after ``timeout_s``); its exit code and stdout, all output in ``log``."""
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    log.write_text(out + err)
    return proc.returncode, out


def resume_after_crash(settings: Settings, app: Any, run_id: str, *, tries: int = 4) -> Any:
    """Resume ``run_id`` with a :class:`~runlog.processors.resume.Resumer` on ``app`` once the dead
    worker's lease is gone, as ``runlog resumer`` does: a ``contended`` outcome (the resume's own lease
    starved of its heartbeat on a loaded machine with the short ttl these suites use, so it stopped)
    is tried again after the lease is gone, up to ``tries`` times. The last outcome is returned,
    ``contended`` included, so a resume that never gets the run still fails the test."""
    from runlog.processors.demo.run import wait_lease_gone
    from runlog.processors.resume import Resumer

    ttl_s = settings.lease_ttl_ms / 1000
    with Resumer(settings, app) as resumer:
        for _ in range(tries):
            wait_lease_gone(settings, run_id, ttl_s * 6 + 2)
            outcome = resumer.resume(run_id)
            if outcome.result != "contended":
                break
    return outcome
