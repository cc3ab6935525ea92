"""The projector group in motion: members join, leave (SIGTERM), die (SIGKILL) and pause past the
session timeout (SIGSTOP, then SIGCONT) under a stream of runs, and nothing is skipped.

After each scenario every member the fault did not hit is alive, the live namespace equals a rebuild
of the whole log (no event whose update never reached Redis), and a *fresh* member of the same group,
started alone after everyone stopped, changes nothing: the group's committed offsets never passed an
event that was not applied (the skip of issue 24 left two runs wrong that a fresh projector did not
repair, because the commits had moved past them).

Each scenario runs once in ``.ci/run``; ``RUNLOG_MEMBERSHIP_REPEAT=5`` repeats each (the skip this
guards against showed in two trials of five). Results go into the fault report's ``membership``
section.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import redis

from runlog.projections import diff_namespaces
from runlog.schemas import Settings
from tests.integration.processors.harness import (
    converges,
    produce,
    reference,
    start_projector,
    stop,
)
from tests.unit.projections.runlogs import full_run

from .machinery.report import PointEntry, write_section

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPEAT = int(os.environ.get("RUNLOG_MEMBERSHIP_REPEAT", "1"))
FAULTS = ("join_leave", "sigterm", "sigkill", "sigstop")
ENTRIES: list[PointEntry] = []
"""The points of the report's ``membership`` section, the projector's and the resumer's (written after
each scenario)."""


def record(report: Path, entry: PointEntry) -> None:
    """Put ``entry`` in the ``membership`` section (replacing an earlier run of the same point)."""
    ENTRIES[:] = [e for e in ENTRIES if e.point != entry.point] + [entry]
    write_section(report, "membership", ENTRIES)


class Stream:
    """Produces short runs (interleaved, ~12 events each) from a thread until stopped."""

    def __init__(self, settings: Settings, per_second: int = 40) -> None:
        self.settings = settings
        self.per_second = per_second
        self.runs = 0
        self.events = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stream", daemon=True)
        self.error: BaseException | None = None

    def __enter__(self) -> Stream:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        try:
            tick = 0
            while not self._stop.is_set():
                t0 = time.monotonic()
                runs = [full_run(f"m{tick:05d}-{i:02d}", stages=1 + (tick + i) % 3, calls=1)
                        for i in range(self.per_second // 5)]
                stream = [ev for group in zip(*[iter(r) for r in runs], strict=False) for ev in group]
                rest = [ev for r in runs for ev in r[min(len(x) for x in runs):]]
                self.events += produce(self.settings, stream + rest)
                self.runs += len(runs)
                tick += 1
                self._stop.wait(max(0.0, 0.2 - (time.monotonic() - t0)))
        except BaseException as err:  # noqa: BLE001 - reported by the test
            self.error = err


def _alive(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is None


@pytest.mark.parametrize("trial", range(REPEAT))
@pytest.mark.parametrize("fault", FAULTS)
def test_projector_group_members_join_leave_die_and_pause_under_a_stream(
    fault: str, trial: int, topics: Settings, redis_client: redis.Redis, tmp_path: Path, fault_report: Path
) -> None:
    started = time.monotonic()
    group = f"{topics.topic_prefix}grp"
    # a short session timeout, so a paused member is evicted within the scenario
    args = ("--session-timeout-ms", "6000")

    def member(name: str) -> subprocess.Popen[bytes]:
        return start_projector(topics, group, *args, log=tmp_path / f"{name}.log")

    a, b = member("a"), member("b")
    members = [a, b]
    third: subprocess.Popen[bytes] | None = None
    hit: subprocess.Popen[bytes] | None = None
    try:
        with Stream(topics) as stream:
            time.sleep(4)
            for n in range(3):
                if fault == "join_leave":
                    third = member(f"c{n}")
                    time.sleep(6)
                    stop(third)
                    time.sleep(3)
                    continue
                # the other faults hit a member of the group, which is then replaced by a new one
                victim = members[n % 2]
                if fault == "sigterm":
                    stop(victim)
                elif fault == "sigkill":
                    victim.send_signal(signal.SIGKILL)
                    victim.wait(10)
                else:  # sigstop: paused past the session timeout, then resumed
                    victim.send_signal(signal.SIGSTOP)
                    time.sleep(9)
                    victim.send_signal(signal.SIGCONT)
                    time.sleep(4)
                    continue
                hit = victim
                time.sleep(3)
                new = member(f"r{n}")
                members[n % 2] = new
                time.sleep(4)
            time.sleep(2)
        assert stream.error is None, stream.error
        survivors = [m for m in members if m is not hit]
        alive = all(_alive(m) for m in survivors)
        assert alive, f"a member the fault did not hit died: {[m.poll() for m in survivors]}"
        ref = reference(topics, redis_client)
        diff = converges(topics, redis_client, ref, timeout=120)
        # every member stops; a fresh one alone resumes at the group's committed offsets
        for m in members:
            stop(m)
        lone = member("lone")
        members.append(lone)
        again = converges(topics, redis_client, ref, timeout=60)
        entry = PointEntry(f"projector:{fault}#{trial}", "converged", projection_mismatches=len(diff),
                           lost_events=len(again),
                           detail={"group": "projector", "fault": fault, "runs": stream.runs,
                                   "events": stream.events, "differing_keys": diff[:10]})
        entry.checks = {"survivors_alive": alive, "projection_equal": not diff,
                        "fresh_member_equal": not again}
        entry.conclude("converged", started)
        record(fault_report, entry)
        assert diff == [], f"the projection differs from a rebuild of the log: {diff[:10]}"
        assert again == [] and diff_namespaces(redis_client, topics.redis_prefix, ref) == []
    finally:
        for m in [*members, *([third] if third else [])]:
            if m.poll() is None:
                m.send_signal(signal.SIGCONT)
                stop(m)
