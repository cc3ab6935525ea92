"""The sweep on its own: which runs it asks to resume, which it leaves, and the group's turn."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from runlog.processors.metrics import ResumerMetrics
from runlog.processors.resume._sweep import Sweeper
from runlog.projections import RunState, RunStatus
from runlog.projections._marker import READY, REBUILDING, Marker
from runlog.projections._state import WaitInfo
from runlog.schemas import WorkflowSpec


class _Pipe:
    def __init__(self, r: _Redis) -> None:
        self.r, self.keys = r, []

    def hget(self, key: str, field: str) -> None:
        self.keys.append(key)

    def execute(self) -> list[Any]:
        return [self.r.workflows.get(k) for k in self.keys]


class _Redis:
    def __init__(self) -> None:
        self.leased: set[str] = set()
        self.workflows: dict[str, bytes] = {}  # state key -> its workflow field
        self.turns: dict[str, tuple[str, int]] = {}

    def exists(self, key: str) -> int:
        return int(key in self.leased)

    def set(self, key: str, value: str, *, nx: bool, px: int) -> bool:
        if nx and key in self.turns:
            return False
        self.turns[key] = (value, px)
        return True

    def pipeline(self, transaction: bool = True) -> _Pipe:
        return _Pipe(self)


class _Projection:
    def __init__(self) -> None:
        self.state = READY
        self.running: list[str] = []
        self.states: dict[str, RunState] = {}

    def marker(self) -> Marker | None:
        return Marker("g1", self.state)

    def runs(self, status: RunStatus | None = None) -> list[str]:
        assert status in (RunStatus.RUNNING, RunStatus.WAITING)
        return list(self.running) if status is RunStatus.RUNNING else \
            [r for r, st in self.states.items() if st.status is RunStatus.WAITING]

    def load_states(self, run_ids: Iterable[str]) -> dict[str, RunState]:
        return {r: self.states[r] for r in run_ids if r in self.states}

    def state_key(self, run_id: str) -> str:
        return f"state:{run_id}"


class _Active:
    def __init__(self) -> None:
        self.runs: list[tuple[str, str]] = []
        self.gone: set[str] = set()
        self.waits_due: list[tuple[str, str]] = []
        self.unwaited: list[str] = []

    def list(self) -> list[tuple[str, str]]:
        return list(self.runs)

    def cancelled(self, run_ids: Iterable[str]) -> set[str]:
        return self.gone & set(run_ids)

    def due(self) -> list[tuple[str, str]]:
        return list(self.waits_due)

    def claim_due(self, run_id: str) -> bool:
        self.unwaited.append(run_id)
        was = any(r == run_id for r, _ in self.waits_due)
        self.waits_due = [(r, wf) for r, wf in self.waits_due if r != run_id]
        return was


class _Routes:
    def __init__(self) -> None:
        self.parked: dict[str, str] = {}

    def waiting_for(self, run_ids: list[str]) -> dict[str, str]:
        return {r: self.parked[r] for r in run_ids if r in self.parked}


class _World:
    def __init__(self, member: str = "m1", client: _Redis | None = None) -> None:
        self.redis = client or _Redis()
        self.projection, self.active, self.routes = _Projection(), _Active(), _Routes()
        self.requested: list[tuple[str, str]] = []
        self.log: dict[str, RunStatus] = {}
        """Each run's status on the log (absent: RUNNING); ``reads`` counts the sweep's reads."""
        self.reads: list[str] = []
        self.metrics = ResumerMetrics()
        self.sweeper = Sweeper(
            client=self.redis, projection=self.projection, active=self.active,  # type: ignore[arg-type]
            routes=self.routes, workflows=lambda: ["orders", "refunds"],  # type: ignore[arg-type]
            lease_key=lambda r: f"lease:{r}", request=lambda r, why: self.requested.append((r, why)),
            metrics=self.metrics, turn_key="p:sweep:g", member=member, interval_ms=1000,
            on_log=self.on_log)

    def on_log(self, run_id: str) -> RunStatus | None:
        self.reads.append(run_id)
        return self.log.get(run_id, RunStatus.RUNNING) if run_id != "absent" else None


def test_runs_of_this_apps_workflows_without_a_lease_are_requested_and_the_others_left() -> None:
    w = _World()
    w.active.runs = [("dead", "orders"), ("alive", "orders"), ("cancelled", "refunds"),
                     ("parked", "orders"), ("foreign", "billing")]
    w.redis.leased = {"lease:alive"}
    w.active.gone = {"cancelled"}
    w.routes.parked = {"parked": "orders@2"}
    report = w.sweeper.sweep()
    assert (report.requested, report.alive) == (["dead"], 1)
    assert w.requested == [("dead", "lease expired")]
    assert w.metrics.registry.get_sample_value("runlog_resumer_sweeps_total") == 1
    assert w.metrics.registry.get_sample_value(
        "runlog_resumer_sweep_requested_total", {"reason": "lease_expired"}) == 1


def test_the_running_index_is_swept_only_while_the_projection_is_whole() -> None:
    w = _World()
    w.active.runs = [("active", "orders")]
    w.projection.running = ["old", "active", "foreign"]
    w.redis.workflows = {"state:old": b"refunds", "state:active": b"orders", "state:foreign": b"billing"}
    w.projection.state = REBUILDING
    assert w.sweeper.candidates() == ["active"]
    w.projection.state = READY
    assert w.sweeper.candidates() == ["active", "old"]
    assert w.sweeper.sweep().requested == ["active", "old"]


def test_waits_past_their_deadline_are_handed_to_their_policy_once() -> None:
    w = _World()
    w.active.waits_due = [("late", "orders"), ("foreign", "billing")]
    assert w.sweeper.sweep().requested == ["late"]
    assert w.requested == [("late", "wait timed out")] and w.active.unwaited == ["late"]


def test_a_parent_whose_children_all_ended_is_requested_once_they_have() -> None:
    """A child's request to wake its parent was lost: the sweep finds the waiting parent whose awaited
    children the projection shows ended (a blocked one counts), and leaves one still waiting alone."""
    w = _World()
    wf = WorkflowSpec("orders", "1", ())
    wait = WaitInfo("fan/runlog.child/0", "runlog.child", 0, ("c1", "c2"))
    w.projection.states = {
        "parent": RunState("parent", status=RunStatus.WAITING, workflow=wf, waiting=wait),
        "other": RunState("other", status=RunStatus.WAITING, workflow=wf,
                          waiting=WaitInfo("fan/runlog.child/0", "runlog.child", 0, ("c1", "c3"))),
        "signal": RunState("signal", status=RunStatus.WAITING, workflow=wf,
                           waiting=WaitInfo("s/runlog.wait/0", "x")),
        "c1": RunState("c1", status=RunStatus.COMPLETED), "c2": RunState("c2", status=RunStatus.BLOCKED),
        "c3": RunState("c3", status=RunStatus.RUNNING)}
    assert w.sweeper.parents_to_wake() == ["parent"]
    assert w.sweeper.sweep().requested == ["parent"]
    assert w.requested == [("parent", "children ended")]
    w.projection.state = REBUILDING  # indexes moving: nothing is read from them
    assert w.sweeper.parents_to_wake() == []


def test_one_member_of_the_group_sweeps_per_interval() -> None:
    shared = _Redis()
    one, two = _World("m1", shared), _World("m2", shared)
    one.active.runs = two.active.runs = [("dead", "orders")]
    first = one.sweeper.sweep_if_turn()
    assert first is not None and first.requested == ["dead"]
    assert two.sweeper.sweep_if_turn() is None and two.requested == []
    assert shared.turns["p:sweep:g"] == ("m1", 950)  # the turn ends just before the next interval


def test_a_run_only_the_index_lists_is_read_on_the_log_before_it_is_requested() -> None:
    """Issue 38: with no projector running the index still listed two completed runs ``RUNNING``;
    the sweep requested them every interval, forever. Only the log decides; an ended run is read once."""
    w = _World()
    w.active.runs = [("active", "orders")]
    w.projection.running = ["done", "active", "absent", "blocked", "stale"]
    w.redis.workflows = {f"state:{r}": b"orders" for r in w.projection.running}
    w.log = {"done": RunStatus.COMPLETED, "blocked": RunStatus.BLOCKED}
    first = w.sweeper.sweep()
    assert first.requested == ["active", "stale"]
    assert first.ended == ["done", "absent", "blocked"]
    assert "active" not in w.reads  # the writers' own active set is not read again on the log
    w.reads.clear()
    second = w.sweeper.sweep()
    assert second.requested == ["active", "stale"]
    assert "done" not in w.reads and second.ended == ["absent", "blocked"]  # ended: remembered
