"""Version pickup on its own: parking a run for a version's member, and claiming the parked runs of the
versions this member serves."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import pytest

from runlog.processors.metrics import ResumerMetrics
from runlog.processors.resume import ResumeOutcome, ResumePlan
from runlog.processors.resume._versions import VersionPickup, VersionView
from runlog.projections import RunState, RunStatus


class _Routes:
    def __init__(self) -> None:
        self.waiting: dict[str, list[str]] = {}
        self.members: dict[str, tuple[str, ...]] = {}
        self.taken_by_another: set[str] = set()
        self.settled: list[str] = []

    def park(self, run_id: str, lbl: str) -> None:
        self.waiting.setdefault(lbl, []).append(run_id)

    def settle(self, run_ids: Iterable[str]) -> None:
        for r in run_ids:
            self.settled.append(r)
            for runs in self.waiting.values():
                if r in runs:
                    runs.remove(r)

    def live(self, lbl: str) -> tuple[str, ...]:
        return self.members.get(lbl, ())

    def parked(self, lbl: str, limit: int = 100) -> list[str]:
        return list(self.waiting.get(lbl, []))[:limit]

    def claim(self, run_id: str, lbl: str) -> bool:
        self.waiting[lbl].remove(run_id)
        return run_id not in self.taken_by_another

    def labels(self) -> list[str]:
        return sorted(set(self.waiting) | set(self.members))

    def views(self, labels: Iterable[str]) -> list[VersionView]:
        return [VersionView(lbl, len(self.waiting.get(lbl, [])), None, self.members.get(lbl, ()))
                for lbl in labels]


class _Projection:
    def __init__(self) -> None:
        self.states: dict[str, RunState] = {}

    def load_states(self, run_ids: Iterable[str]) -> dict[str, RunState]:
        return {r: self.states[r] for r in run_ids if r in self.states}


class _World:
    def __init__(self, serves: tuple[str, ...] = ("orders@2",)) -> None:
        self.routes, self.projection = _Routes(), _Projection()
        self.finished: set[str] = set()
        self.resumed: list[str] = []
        self.results: dict[str, str] = {}
        self.metrics = ResumerMetrics()
        self.pickup = VersionPickup(self.routes, serves, projection=self.projection,  # type: ignore[arg-type]
                                    resume=self.resume, finished=self.finished.__contains__,
                                    metrics=self.metrics)

    def resume(self, run_id: str) -> ResumeOutcome | None:
        self.resumed.append(run_id)
        result = self.results.get(run_id, "completed")
        return ResumeOutcome(run_id, result, ResumePlan(run_id, "RUNNING", 0, 0, None))


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_parked_run_waits_and_a_version_nobody_serves_is_warned_about_once(
        caplog: pytest.LogCaptureFixture) -> None:
    w = _World(serves=("orders@1",))
    caplog.set_level(logging.INFO, logger="runlog.resumer")
    w.pickup.park("r1", "orders@2")
    w.pickup.park("r2", "orders@2")
    assert w.routes.waiting == {"orders@2": ["r1", "r2"]} and w.routes.settled == []
    assert len(_warnings(caplog)) == 1 and "no member serves orders@2" in _warnings(caplog)[0]
    w.routes.members["orders@3"] = ("m9",)
    w.pickup.park("r3", "orders@3")  # a live member serves it: no warning
    assert len(_warnings(caplog)) == 1


def test_a_run_that_finished_meanwhile_is_not_left_parked() -> None:
    w = _World(serves=("orders@1",))
    w.finished.add("r1")
    w.pickup.park("r1", "orders@2")
    assert w.routes.settled == ["r1"] and w.routes.waiting == {"orders@2": []}


def test_pickup_resumes_the_runs_of_served_versions_that_this_member_claimed() -> None:
    w = _World(serves=("orders@2",))
    w.routes.waiting = {"orders@2": ["r1", "r2", "r3"], "orders@1": ["r4"]}
    w.routes.taken_by_another = {"r2"}
    w.routes.members = {"orders@2": ("me",)}
    w.results["r3"] = "not_served"  # left to another member: not reported
    out = w.pickup.pick_up_parked()
    assert [o.run_id for o in out] == ["r1"] and w.resumed == ["r1", "r3"]
    assert w.routes.waiting["orders@1"] == ["r4"]  # not this member's version
    value = w.metrics.registry.get_sample_value
    assert value("runlog_resumer_runs_waiting_for_version", {"workflow": "orders", "version": "1"}) == 1
    assert value("runlog_resumer_version_members", {"workflow": "orders", "version": "2"}) == 1


def test_pickup_unparks_finished_runs_of_versions_this_member_does_not_serve() -> None:
    w = _World(serves=("orders@2",))
    w.routes.waiting = {"orders@1": ["done", "cancelled", "open"]}
    w.projection.states = {"done": RunState("done", status=RunStatus.COMPLETED),
                           "cancelled": RunState("cancelled", status=RunStatus.CANCELLED),
                           "open": RunState("open", status=RunStatus.RUNNING)}
    assert w.pickup.pick_up_parked() == [] and w.resumed == []
    assert sorted(w.routes.settled) == ["cancelled", "done"] and w.routes.waiting == {"orders@1": ["open"]}
