"""Worker processes for the crash suites, forked from a server process that has imported Runlog and
its clients once, instead of a new interpreter importing them for each worker.

The crash suites start hundreds of worker processes (the orders matrix two per crash point, the
agent suites one per call boundary); each new interpreter spends about a second of CPU importing
Runlog, confluent-kafka, redis, fastavro and the agent SDKs before it does anything. A
:mod:`multiprocessing` fork server (one per test process, started on first use) imports them once;
each worker is forked from it with its own environment, working directory, ``sys.argv`` and output
files, runs its module as ``__main__`` (what ``python -m`` does) and exits with its code. A worker
SIGKILLed at a crash point ends exactly as a separate interpreter would (exit ``-9``, nothing
flushed), and the fork server holds no thread, client or socket that a child could inherit.

``RUNLOG_TEST_FORK=0`` starts every worker as a new interpreter (``subprocess.Popen``) instead.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
from multiprocessing.context import ForkServerContext
from pathlib import Path

__all__ = ["ForkedWorker", "enabled", "start"]

PRELOAD = ["confluent_kafka", "confluent_kafka.admin", "redis", "fastavro", "runlog.producers",
           "runlog.processors.resume", "runlog.processors.demo.worker", "agents", "pydantic_ai"]
"""Imported once by the fork server (a module that is not installed is left out)."""

_context: ForkServerContext | None = None


def enabled() -> bool:
    return os.environ.get("RUNLOG_TEST_FORK", "1") != "0" and sys.platform.startswith("linux")


def _ctx() -> ForkServerContext:
    global _context
    if _context is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        _context = ctx
    return _context


def _child(module: str, args: list[str], env: dict[str, str], cwd: str, out: str, err: str) -> None:
    """The forked worker: ``python -m module args`` with ``env`` in ``cwd``, output to the files."""
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - the process's own stdout
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sys.argv = [module, *args]
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        if stop.code is None:
            code = 0
        elif isinstance(stop.code, int):
            code = stop.code
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - what an interpreter would print before exiting 1
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class ForkedWorker:
    """The part of :class:`subprocess.Popen` the crash suites use, for a forked worker."""

    def __init__(self, module: str, args: list[str], env: dict[str, str], cwd: Path) -> None:
        self._dir = tempfile.mkdtemp(prefix="runlog-worker-")
        self._out, self._err = os.path.join(self._dir, "out"), os.path.join(self._dir, "err")
        self._proc = _ctx().Process(target=_child, args=(module, args, env, str(cwd), self._out, self._err),
                                    daemon=False)
        self._proc.start()
        self.pid = self._proc.pid
        self.args = [module, *args]
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and not self._proc.is_alive():
            self.returncode = self._proc.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._proc.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        out, err = (Path(p).read_text(errors="replace") if os.path.exists(p) else ""
                    for p in (self._out, self._err))
        shutil.rmtree(self._dir, ignore_errors=True)
        return out, err

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def start(module: str, args: list[str], env: dict[str, str],
          cwd: Path) -> ForkedWorker | subprocess.Popen[str]:
    """A worker running ``python -m module args``: forked (:class:`ForkedWorker`) or, with
    ``RUNLOG_TEST_FORK=0``, a new interpreter."""
    if enabled():
        return ForkedWorker(module, args, env, cwd)
    return subprocess.Popen([sys.executable, "-m", module, *args], env=env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
