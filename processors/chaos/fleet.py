"""The chaos run's long-lived Runlog processes: resumer and projector members, real subprocesses
(``runlog resumer`` and ``runlog project``) that faults kill, stop, add and remove.

A member killed is replaced a little later, as a supervisor would; the fleet keeps between ``low`` and
``high`` members of each role.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Fleet", "Member"]

_ROOT = str(Path(__file__).resolve().parents[2])
APP = "runlog.processors.chaos.app:app"


@dataclass
class Member:
    role: str
    name: str
    proc: subprocess.Popen[bytes]
    fate: str = ""
    """Why it ended when a fault or the end of the run ended it (``killed``, ``left``, ``stopped``);
    empty for one alive, or one that exited on its own."""

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class Fleet:
    """Resumer and projector members, their stderr in ``logs``."""

    env: Mapping[str, Mapping[str, str]]
    """Role -> the environment of its processes (its proxied addresses)."""
    logs: Path
    low: int = 1
    high: int = 3
    members: list[Member] = field(default_factory=list)
    _n: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def start(self, role: str) -> Member:
        name = f"{role}-{next(self._n)}"
        cmd = ([sys.executable, "-m", "runlog", "resumer", "--app", APP] if role == "resumer" else
               [sys.executable, "-m", "runlog", "project", "--app-id", "chaos-projector", "--within", "0.2",
                "--session-timeout-ms", "10000"])
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{name}.log", "ab") as err:
            proc = subprocess.Popen(cmd, cwd=_ROOT, env=dict(self.env[role]), stdin=subprocess.DEVNULL,
                                    stdout=err, stderr=err, start_new_session=True)
        m = Member(role, name, proc)
        self.members.append(m)
        return m

    def alive(self, role: str) -> list[Member]:
        return [m for m in self.members if m.role == role and m.alive]

    def replace_dead(self) -> list[Member]:
        """Start members until each role has ``low`` alive (a supervisor restarting what died)."""
        started = []
        for role in self.env:
            while len(self.alive(role)) < self.low:
                started.append(self.start(role))
        return started

    def stop_all(self, timeout: float = 60.0) -> None:
        """SIGTERM every member (SIGCONT first: a stopped one cannot exit), then SIGKILL what remains."""
        for m in self.members:
            if m.alive:
                m.fate = "stopped"
                os.killpg(m.proc.pid, signal.SIGCONT)
                m.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for m in self.members:
            try:
                m.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                m.proc.kill()
                m.proc.wait(10)

    def exit_codes(self) -> dict[str, int | None]:
        return {m.name: m.proc.poll() for m in self.members}

    def died(self) -> dict[str, int | None]:
        """Members that exited on their own (no fault and not the end killed them), with their exit codes."""
        return {m.name: m.proc.poll() for m in self.members if not m.fate and not m.alive}
