"""What a chaos run leaves behind when it is killed: nothing. Its broker, Redis, Toxiproxy, workers,
resumers and projectors run in sessions of their own (a fault signals each alone), so a SIGKILL of
``runlog chaos`` would orphan them, a private Kafka broker among them.

:class:`Reaper` marks every process the run starts with ``RUNLOG_CHAOS_RUN=<id>`` in its environment
(set in this process's environment while the run lasts, so each child inherits it) and starts a small
watchdog process. A process that rewrites its environment's memory for its title (``redis-server``
does) is also named to the reaper by its pid (:meth:`Reaper.track`). The watchdog waits for its parent
to die; when the parent ends without stopping it (a SIGKILL, a crash), it SIGKILLs every process whose
environment carries the run's mark and every tracked pid, then exits.
A run that ends normally stops its own processes and then the watchdog. Linux only (``/proc``);
elsewhere the watchdog has nothing to read and the run's processes are left as before.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path

__all__ = ["MARK", "Reaper"]

MARK = "RUNLOG_CHAOS_RUN"
"""The environment variable naming the chaos run a process belongs to."""

_WATCHDOG = r"""
import os, signal, sys, time
parent, mark, tracked = int(sys.argv[1]), sys.argv[2].encode(), sys.argv[3]
while os.getppid() == parent:
    time.sleep(0.5)
me = os.getpid()
try:
    with open(tracked) as f:
        pids = {int(line) for line in f if line.strip()}
except OSError:
    pids = set()
for pid in pids:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
for name in os.listdir("/proc"):
    if not name.isdigit() or int(name) == me:
        continue
    try:
        with open(f"/proc/{name}/environ", "rb") as f:
            marked = mark in f.read().split(b"\0")
        if marked:
            os.kill(int(name), signal.SIGKILL)
    except OSError:
        pass
try:
    os.unlink(tracked)
except OSError:
    pass
"""


class Reaper:
    """The mark of one chaos run and its watchdog (see the module docstring); a context manager."""

    def __init__(self, run_id: str | None = None) -> None:
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._before: str | None = None
        fd, name = tempfile.mkstemp(prefix=f"runlog-chaos-{self.run_id}-", suffix=".pids")
        os.close(fd)
        self._tracked = Path(name)

    def track(self, pid: int) -> None:
        """Name a process of the run by its pid (one whose environment cannot be read for the mark)."""
        with open(self._tracked, "a") as f:
            f.write(f"{pid}\n")

    @property
    def env(self) -> Mapping[str, str]:
        """The mark, for a child started with an environment of its own."""
        return {MARK: self.run_id}

    def start(self) -> None:
        """Mark this process's environment (every child started from now on inherits it) and start the
        watchdog."""
        self._before = os.environ.get(MARK)
        os.environ[MARK] = self.run_id
        env = {k: v for k, v in os.environ.items() if k != MARK}  # the watchdog is not a target
        self._watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(os.getpid()), f"{MARK}={self.run_id}", str(self._tracked)],
            env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)  # a Ctrl-C to the run's group leaves it to the run's own unwinding

    def stop(self) -> None:
        """The run ended on its own (its processes stopped): stop the watchdog, unmark the environment."""
        if self._watchdog is not None:
            with contextlib.suppress(ProcessLookupError):
                self._watchdog.send_signal(signal.SIGKILL)
            self._watchdog.wait(10)
            self._watchdog = None
        self._tracked.unlink(missing_ok=True)
        if self._before is None:
            os.environ.pop(MARK, None)
        else:
            os.environ[MARK] = self._before

    def __enter__(self) -> Reaper:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

