"""The crash suites' forked workers (:mod:`tests._fork`) behave as ``python -m`` would: the module
runs as ``__main__`` with its own argv, environment and working directory, its exit code and output
come back, a SIGKILL reads as ``-9``, and a worker that outlives its timeout raises TimeoutExpired."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests._fork import ForkedWorker

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork server: Linux")

ROOT = Path(__file__).resolve().parents[2]


def test_a_forked_worker_runs_its_module_as_main_with_its_argv_env_and_cwd(tmp_path: Path) -> None:
    env = {**os.environ, "RUNLOG_FORK_PROBE": "probe-1"}
    w = ForkedWorker("tests.unit._fork_probe", ["print", "a", "b"], env, tmp_path)
    out, err = w.communicate(timeout=60)
    assert w.returncode == 0, err
    assert out.splitlines() == ["name=__main__", "argv=a,b", "env=probe-1", f"cwd={tmp_path}"]


def test_exit_codes_and_a_raised_error_come_back(tmp_path: Path) -> None:
    w = ForkedWorker("tests.unit._fork_probe", ["exit", "3"], dict(os.environ), ROOT)
    assert w.communicate(timeout=60)[0] == "" and w.returncode == 3
    w = ForkedWorker("tests.unit._fork_probe", ["raise"], dict(os.environ), ROOT)
    _, err = w.communicate(timeout=60)
    assert w.returncode == 1 and "RuntimeError: the probe raised" in err


def test_a_worker_that_kills_itself_reads_minus_nine_and_keeps_what_it_printed(tmp_path: Path) -> None:
    w = ForkedWorker("tests.unit._fork_probe", ["sigkill"], dict(os.environ), ROOT)
    out, _ = w.communicate(timeout=60)
    assert w.returncode == -signal.SIGKILL and out == "before the kill\n"


def test_a_worker_past_its_timeout_raises_and_can_be_killed(tmp_path: Path) -> None:
    w = ForkedWorker("tests.unit._fork_probe", ["sleep"], dict(os.environ), ROOT)
    with pytest.raises(subprocess.TimeoutExpired):
        w.communicate(timeout=0.5)
    assert w.poll() is None
    w.kill()
    w.communicate(timeout=30)
    assert w.returncode == -signal.SIGKILL
