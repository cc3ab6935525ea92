"""Schedules on the real broker and Redis: a schedule ticking every 2 s, three resumer members (one a
process SIGKILLed mid-way, one paused past the group's session timeout), about 24 s: exactly one run
per tick, every run completed; the CLI adds, lists, pauses and removes; the book is rebuilt from the
log when Redis loses it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis

from runlog.processors.demo.run import worker_env
from runlog.processors.inspect import runs_from_log
from runlog.processors.resume import ResumeOutcome, ResumerService
from runlog.processors.schedule import ScheduleBook
from runlog.producers.run._runs import run_id_for_key
from runlog.projections import RunStatus
from runlog.schemas import Settings
from tests.integration.resume._scheduled import app

pytestmark = pytest.mark.integration

ROOT = str(Path(__file__).resolve().parents[3])


def _env(settings: Settings) -> dict[str, str]:
    env = worker_env(settings, "http://127.0.0.1:9")
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env["PYTHONPATH"]])
    return env


def _cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runlog", *args], env=_env(settings), capture_output=True,
                          text=True, timeout=60)


class _Pausable:
    """A member on a thread whose serving loop can be paused (it neither polls nor heartbeats its
    poll loop, as a stopped-the-world process) and stopped."""

    def __init__(self, settings: Settings, name: str, done: list[ResumeOutcome]) -> None:
        self.service = ResumerService(settings, app, on_outcome=done.append)
        self.name, self.paused, self.halt = name, threading.Event(), threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, name=f"member-{name}", daemon=True)
        self.thread.start()

    def _stop(self) -> bool:
        while self.paused.is_set() and not self.halt.is_set():
            time.sleep(0.05)
        return self.halt.is_set()

    def _run(self) -> None:
        try:
            self.service.serve(stop=self._stop)
        except BaseException as err:  # noqa: BLE001 - the test reports it
            self.errors.append(err)

    def leave(self) -> None:
        self.halt.set()
        self.thread.join(60)
        self.service.close()


@pytest.mark.slow
def test_a_schedule_starts_exactly_one_run_per_tick_across_members_that_die_and_pause(
        topics: Settings) -> None:
    settings = topics
    added = _cli(settings, "schedule", "add", "beat", "--every", "2s", "--workflow", "beat",
                 "--params", '{"k": 7}', "--catch-up", "none")
    assert added.returncode == 0, added.stderr
    t_start = int(time.time() * 1000)
    killed = subprocess.Popen([sys.executable, "-m", "runlog", "resumer", "--app",
                               "tests.integration.resume._scheduled:app"], env=_env(settings),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    done: list[ResumeOutcome] = []
    members = [_Pausable(settings, f"t{i}", done) for i in range(2)]
    try:
        time.sleep(6)
        killed.send_signal(signal.SIGKILL)  # abruptly, whatever it holds (the turn, a run's lease)
        killed.wait(30)
        time.sleep(3)
        members[0].paused.set()  # past the session timeout (10 s)
        time.sleep(12)
        members[0].paused.clear()
        time.sleep(3)
        t_end = int(time.time() * 1000)
        paused = _cli(settings, "schedule", "pause", "beat")
        assert paused.returncode == 0 and "paused" in paused.stdout, paused.stderr
        t_paused = int(time.time() * 1000)  # a ticker that listed the book before the pause landed
        # may still start the ticks up to then (on a loaded host the command takes seconds)
        listed = _cli(settings, "schedule", "list", "--json")
        [doc] = json.loads(listed.stdout)
        assert doc["name"] == "beat" and doc["paused"] is True and doc["params"] == {"k": 7}
        # every tick of the window has its run, and it completes (the killed member's partitions move)
        ticks = [t for t in range((t_start // 2000 + 1) * 2000, t_end - 1000, 2000)]
        expected = {run_id_for_key(f"schedule:beat:{t}"): t for t in ticks}
        deadline = time.monotonic() + 60
        while True:
            runs = {r: s for r, s in runs_from_log(settings).items()
                    if s.workflow is not None and s.workflow.name == "beat"}
            if all(r in runs and runs[r].status is RunStatus.COMPLETED for r in expected):
                break
            finished = {r for r, s in runs.items() if s.status is RunStatus.COMPLETED}
            assert time.monotonic() < deadline, f"not all ticks ran: {sorted(set(expected) - finished)}"
            time.sleep(1)
        # the schedule's ticks, from its creation (inside `schedule add`, before t_start) to the pause
        keyed = {run_id_for_key(f"schedule:beat:{t}")
                 for t in range((doc["created_at_ms"] // 2000 + 1) * 2000, t_paused + 1, 2000)}
        assert set(runs) <= keyed, (f"runs that belong to no tick of ({doc['created_at_ms']}, {t_paused}]: "
                                    f"{ {r: runs[r].started_at for r in set(runs) - keyed} } (started at)")
        print(f"{len(expected)} ticks over {(t_end - t_start) / 1000:.0f}s, {len(runs)} runs")
        assert all(runs[rid].params_ref is not None for rid in expected)
        assert not members[0].errors and not members[1].errors
        assert _cli(settings, "schedule", "remove", "beat").returncode == 0
        gone = _cli(settings, "schedule", "pause", "beat")
        assert gone.returncode == 1 and "no schedule named 'beat'" in gone.stderr
    finally:
        if killed.poll() is None:
            killed.kill()
        killed.communicate(timeout=10)
        for m in members:
            m.leave()


def test_the_book_is_rebuilt_from_the_log_and_bad_input_is_refused(topics: Settings) -> None:
    nightly = ("add", "nightly", "--cron", "0 2 * * *", "--workflow", "beat")
    assert _cli(topics, "schedule", *nightly).returncode == 0
    assert _cli(topics, "schedule", "add", "gone", "--every", "1h", "--workflow", "beat").returncode == 0
    assert _cli(topics, "schedule", "remove", "gone").returncode == 0
    assert _cli(topics, "schedule", "pause", "nightly").returncode == 0
    r = redis.Redis.from_url(topics.redis_url)
    try:
        lost = f"{topics.redis_prefix}:{{schedules}}"
        r.delete(lost, f"{lost}:synced")  # Redis lost the schedules
        with ScheduleBook(topics, r) as book:
            [s] = book.list()
        assert (s.name, s.cron, s.paused) == ("nightly", "0 2 * * *", True)
    finally:
        r.close()
    for args, code in ((("add", "x", "--cron", "61 * * * *", "--workflow", "beat"), 2),
                       (("add", "x", "--every", "soon", "--workflow", "beat"), 2),
                       (("add", "x", "--every", "2s", "--workflow", "beat", "--params", "[1]"), 2),
                       (("resume", "nope"), 1)):
        out = _cli(topics, "schedule", *args)
        assert out.returncode == code, (args, out.stdout, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
