"""A chaos run SIGKILLed leaves no process behind: the reaper's watchdog kills every process carrying
the run's mark, and every pid tracked, once the run's process is gone, and nothing else; a run that
ends normally stops the watchdog and unmarks its environment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runlog.processors.chaos.reaper import MARK, Reaper

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="the reaper reads /proc")

_RUN = r"""
import os, subprocess, sys, time
from runlog.processors.chaos.reaper import MARK, Reaper
reaper = Reaper("t-reap")
reaper.start()
kids = [subprocess.Popen(["sleep", "300"], start_new_session=True) for _ in range(2)]
# one whose environment does not show the mark (redis-server overwrites it with its title): tracked
unmarked = subprocess.Popen(["sleep", "300"], start_new_session=True,
                            env={k: v for k, v in os.environ.items() if k != MARK})
reaper.track(unmarked.pid)
print(" ".join(str(k.pid) for k in [*kids, unmarked]), flush=True)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie is dead
    except FileNotFoundError:
        return False


def test_a_killed_run_takes_its_marked_processes_with_it_and_only_those() -> None:
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)  # no mark
    run = subprocess.Popen([sys.executable, "-c", _RUN], stdout=subprocess.PIPE, text=True,
                           env={k: v for k, v in os.environ.items() if k != MARK})
    try:
        assert run.stdout is not None
        kids = [int(p) for p in run.stdout.readline().split()]
        assert len(kids) == 3 and all(_alive(k) for k in kids)
        time.sleep(1.0)  # the watchdog is past its start-up
        assert all(_alive(k) for k in kids)  # nothing happens while the run lives
        run.send_signal(signal.SIGKILL)
        run.wait(10)
        deadline = time.monotonic() + 10
        while any(_alive(k) for k in kids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(k) for k in kids), "the run's processes outlived it"
        assert _alive(bystander.pid), "a process without the mark was killed"
    finally:
        bystander.kill()
        run.kill()
        bystander.wait(10)
        run.wait(10)
        if run.stdout is not None:
            run.stdout.close()


def test_a_run_that_ends_stops_its_watchdog_and_restores_the_environment() -> None:
    before = os.environ.get(MARK)
    with Reaper("t-end") as reaper:
        assert os.environ[MARK] == "t-end" and reaper.env == {MARK: "t-end"}
        watchdog = reaper._watchdog
        assert watchdog is not None and watchdog.poll() is None
    assert watchdog.poll() is not None and os.environ.get(MARK) == before
