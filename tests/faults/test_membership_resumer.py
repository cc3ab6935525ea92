"""The resumer group in motion: ``runlog resumer`` members join, leave (SIGTERM), die (SIGKILL) and pause
past the session timeout (SIGSTOP, then SIGCONT) while they resume a stream of runs with effects.

The runs are the shipment workflow of ``tests/integration/cluster/_stream.py`` (an IDEMPOTENT reservation
and a RECONCILE_FIRST label per order, counted by the demo world's services in their own files). Each is
started and abandoned with its lease left to expire, as by a worker that died, and its resume requested.
After each scenario: every member the fault did not hit is alive, every run is COMPLETED, and every
order has exactly one reservation and one label (0 duplicate effects).

Each scenario runs once in ``.ci/run``; ``RUNLOG_MEMBERSHIP_REPEAT=5`` repeats each. Results go into
the fault report's ``membership`` section, beside the projector's (``test_membership_projector.py``).
"""

from __future__ import annotations

import hashlib
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import redis

from runlog.processors.demo.run import worker_env
from runlog.processors.resume import request_resume
from runlog.producers import Runner
from runlog.projections import RunStatus
from runlog.schemas import Settings
from tests.integration.cluster import _stream
from tests.integration.processors.harness import ROOT, start_projector, stop, wait_until
from tests.integration.resume.conftest import log_of, served_world

from .machinery.report import PointEntry
from .test_membership_projector import ENTRIES, FAULTS, REPEAT, _alive, record

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ORDERS_PER_BATCH = 4
BATCHES = 8


def _world_counts(root: Path, orders: list[str]) -> tuple[dict[str, int], dict[str, int]]:
    """From the services' own files: reservations and labels per order."""
    by_sha = {hashlib.sha256(_stream.reservation(o)).hexdigest(): o for o in orders}
    reservations: dict[str, int] = {}
    with sqlite3.connect(root / "assets.db") as db:
        for (sha,) in db.execute("SELECT sha256 FROM assets"):
            order = by_sha.get(sha, f"unknown {sha}")
            reservations[order] = reservations.get(order, 0) + 1
    labels: dict[str, int] = {}
    with sqlite3.connect(root / "platform.db") as db:
        for (title,) in db.execute("SELECT title FROM articles"):
            order = title.removeprefix("order ")
            labels[order] = labels.get(order, 0) + 1
    return reservations, labels


class Abandoner:
    """Starts shipment runs in batches from a thread and abandons each (lease left to expire), then
    requests its resume: the stream the resumer group works while its members change."""

    def __init__(self, settings: Settings, world_url: str) -> None:
        self.settings = settings
        self.wf = _stream.stream_app(_stream.WorldClient(world_url)).registry.get(_stream.WORKFLOW)
        self.runs: dict[str, str] = {}
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="abandoner", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self._thread.join(120)

    def _run(self) -> None:
        try:
            for b in range(BATCHES):
                runner = Runner.from_settings(self.settings)
                try:
                    for i in range(ORDERS_PER_BATCH):
                        order = f"o-{b:02d}-{i}"
                        h = runner.start_run(self.wf, {"order": order, "pause": 0})
                        assert h.session is not None
                        h.session.close(release=False)
                        self.runs[h.run_id] = order
                finally:
                    runner.close()  # no more heartbeats: the leases expire after their ttl
                for run_id in list(self.runs)[-ORDERS_PER_BATCH:]:
                    request_resume(self.settings, run_id, "abandoned", requested_by="test")
                time.sleep(1.5)
        except BaseException as err:  # noqa: BLE001 - reported by the test
            self.error = err


@pytest.mark.parametrize("trial", range(REPEAT))
@pytest.mark.parametrize("fault", FAULTS)
def test_resumer_group_members_join_leave_die_and_pause_while_resuming_runs_with_effects(
    fault: str, trial: int, topics: Settings, redis_client: redis.Redis, tmp_path: Path, fault_report: Path
) -> None:
    started = time.monotonic()
    with served_world(tmp_path / "world") as world:
        s = topics.with_(sweep_interval_ms=1000, resumer_group=f"t-resumer-{uuid.uuid4().hex[:8]}",
                         demo_world_url=world.url)
        logs = tmp_path / "logs"
        logs.mkdir()

        def member(name: str) -> subprocess.Popen[bytes]:
            with open(logs / f"{name}.log", "ab") as err:
                return subprocess.Popen(
                    [sys.executable, "-m", "runlog", "resumer", "--app", f"{_stream.__name__}:app"],
                    cwd=ROOT, env=worker_env(s, world.url), stdout=subprocess.DEVNULL, stderr=err)

        projector = start_projector(s, f"{s.topic_prefix}proj", log=logs / "projector.log")
        members = [member("a"), member("b")]
        hit: list[subprocess.Popen[bytes]] = []
        extra: list[subprocess.Popen[bytes]] = []
        stream = Abandoner(s, world.url)
        try:
            time.sleep(3)
            stream.start()
            for n in range(3):
                time.sleep(2)
                if fault == "join_leave":
                    third = member(f"c{n}")
                    extra.append(third)
                    time.sleep(5)
                    stop(third)
                    continue
                victim = members[n % 2]
                if fault == "sigstop":  # paused past the session timeout (10 s), then resumed
                    victim.send_signal(signal.SIGSTOP)
                    time.sleep(12)
                    victim.send_signal(signal.SIGCONT)
                    continue
                if fault == "sigterm":
                    stop(victim)
                else:
                    victim.send_signal(signal.SIGKILL)
                    victim.wait(10)
                hit.append(victim)
                members[n % 2] = member(f"r{n}")  # the supervisor's replacement
            stream.join()
            assert stream.error is None, stream.error
            runs = dict(stream.runs)
            assert len(runs) == ORDERS_PER_BATCH * BATCHES

            def status(run_id: str) -> RunStatus | None:
                history = log_of(s, run_id)
                return history[-1].state.status if history else None

            def settled() -> bool:
                return all(status(r) is RunStatus.COMPLETED for r in runs)

            done = wait_until(settled, 180, every=2.0)
            alive = all(_alive(m) for m in members)
            reservations, labels = _world_counts(tmp_path / "world", sorted(runs.values()))
        finally:
            for m in [*members, *extra]:
                if m.poll() is None:
                    m.send_signal(signal.SIGCONT)
                    stop(m)
            stop(projector)
    orders = sorted(runs.values())
    duplicates = sum(max(0, reservations.get(o, 0) - 1) + max(0, labels.get(o, 0) - 1) for o in orders)
    missing = [o for o in orders if reservations.get(o, 0) == 0 or labels.get(o, 0) == 0]
    left = [r for r in runs if status(r) is not RunStatus.COMPLETED]
    entry = PointEntry(f"resumer:{fault}#{trial}", "completed", duplicate_effects=duplicates,
                       completed=done, detail={"group": "resumer", "fault": fault, "runs": len(runs),
                                               "not_completed": left[:10], "missing_effects": missing[:10]})
    entry.checks = {"survivors_alive": alive, "all_completed": done, "no_duplicate_effect": duplicates == 0,
                    "every_effect_once": not missing}
    entry.conclude("completed", started)
    record(fault_report, entry)
    assert alive, f"a member the fault did not hit died: {[m.poll() for m in members]} (logs in {logs})"
    assert done, f"{len(left)} runs not COMPLETED: {left[:5]} (logs in {logs})"
    assert duplicates == 0 and not missing, (duplicates, missing)
    assert ENTRIES
