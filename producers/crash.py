"""Crash points: the process SIGKILLs itself at a named point of its run's write path.

The way to test one's own workflows' crash safety: run a worker in a child process with a
point armed, let it die there, resume the run, and check every effect happened once. Off
unless armed from outside the write path: a worker's entry point calls :func:`arm_from_env`
(``RUNLOG_CRASH_AT``) or a test calls :func:`arm`. The write path only compares the point it
is at with the armed one (one global read). Points are ``<when>:<what>:<subject>``:

* ``before:<EVENT_TYPE>:<subject>`` just before that event is produced;
* ``after:<EVENT_TYPE>:<subject>`` once that event is produced;
* ``inside:STAGE:<stage>`` after ``STAGE_STARTED``, before the stage function runs;
* ``inside:TOOL:<call_id>`` before the tool function is entered (after any
  ``EFFECT_INTENT`` was confirmed);
* ``before:CLAIM:run`` / ``after:CLAIM:run`` around a keyed run's idempotency claim.

Before killing, the writer waits until every event of the run produced so far
is acknowledged, so the log deterministically ends where the point says (the
crash loses in-flight work, never acknowledged events).

The subject of an event is its ``call_id`` when it has one, else its ``stage``,
else ``run`` (``before:RUN_COMPLETED:run``). A point armed without its subject
(``before:EFFECT_RESULT``) is reached at the first such point of any subject.

:func:`on_crash` replaces the SIGKILL with an action that raises: :mod:`runlog.testing` crashes a
workflow in-process that way and resumes it in the same test.

:func:`on_reach` makes the armed point a pause instead of a crash: the first time the point is
reached the action runs (the network fault tests cut a connection there, or let the test do it)
and the run goes on, as if no point were armed. The point is then disarmed.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping

__all__ = ["ENV", "arm", "arm_from_env", "armed", "crash_point", "event_subject", "kill_self", "on_crash",
           "on_reach"]

ENV = "RUNLOG_CRASH_AT"
"""The environment variable a worker's entry point arms from."""

_armed: str | None = None
_reached: str | None = None
_action: Callable[[str], object] | None = None
_reach: Callable[[str], object] | None = None


def arm(point: str | None) -> None:
    """Crash this process at ``point`` (None: never)."""
    global _armed
    _armed = point or None


def arm_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """Arm from ``RUNLOG_CRASH_AT`` (a worker's entry point); returns the point."""
    arm((os.environ if environ is None else environ).get(ENV))
    return _armed


def armed() -> str | None:
    """The armed crash point, if any."""
    return _armed


def event_subject(stage: str | None, call_id: str | None) -> str:
    """The subject an event's points name: its call id, else its stage, else ``run``."""
    return call_id or stage or "run"


def crash_point(point: str) -> bool:
    """Whether ``point`` is the armed crash point (or, armed without a subject, one of its subjects).
    With an :func:`on_reach` action: runs it once, disarms, and answers False (no crash)."""
    global _reached, _armed
    if _armed is None or not (_armed == point or point.startswith(_armed + ":")):
        return False
    _reached = point
    if _reach is not None:
        _armed = None  # once: the run goes on past the point
        _reach(point)
        return False
    return True


def on_crash(action: Callable[[str], object] | None) -> None:
    """At the armed point, call ``action(point)`` (the point reached, subject included) instead of
    SIGKILL; the action raises to stop the run there (should it return, the process is killed as
    usual). None: SIGKILL again."""
    global _action
    _action = action


def on_reach(action: Callable[[str], object] | None) -> None:
    """At the armed point, call ``action(point)`` (the point reached, subject included) once and go on
    instead of crashing: a fault injected at an effect boundary (a network partition, say) while the
    run continues into it. None: the armed point crashes again."""
    global _reach
    _reach = action


def kill_self() -> None:
    """SIGKILL this process: no cleanup, no flush, no finally blocks (or the :func:`on_crash` action)."""
    if _action is not None:
        _action(_reached or _armed or "")
    os.kill(os.getpid(), signal.SIGKILL)
