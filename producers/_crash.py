"""Crash injection for fault tests: the writer SIGKILLs its own process at a named point.

Off unless ``Settings.crash_at`` (``RUNLOG_CRASH_AT``) is set. Points are
``<when>:<what>:<subject>``:

* ``before:<EVENT_TYPE>:<subject>`` just before that event is produced;
* ``after:<EVENT_TYPE>:<subject>`` once that event is produced;
* ``inside:STAGE:<stage>`` after ``STAGE_STARTED``, before the stage function runs;
* ``inside:TOOL:<call_id>`` before the tool function is entered (after any
  ``EFFECT_INTENT`` was confirmed).

Before killing, the writer waits until every event of the run produced so far
is acknowledged, so the log deterministically ends where the point says (the
crash loses in-flight work, never acknowledged events).

The subject of an event is its ``call_id`` when it has one, else its ``stage``,
else ``run`` (``before:RUN_COMPLETED:run``).
"""

from __future__ import annotations

import os
import signal

__all__ = ["crash_point", "event_subject", "kill_self"]


def event_subject(stage: str | None, call_id: str | None) -> str:
    return call_id or stage or "run"


def crash_point(crash_at: str | None, point: str) -> bool:
    """Whether ``point`` is the configured crash point."""
    return crash_at is not None and crash_at == point


def kill_self() -> None:
    """SIGKILL this process: no cleanup, no flush, no finally blocks."""
    os.kill(os.getpid(), signal.SIGKILL)
