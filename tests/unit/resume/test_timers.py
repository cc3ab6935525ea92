"""The resumers' timers on their own: a due run is claimed by one member only, another App's runs
and runs not yet due are left, and the index is re-armed only from a whole projection."""

from __future__ import annotations

from runlog.processors.metrics import ResumerMetrics
from runlog.processors.resume._timers import Timers
from runlog.projections import RunStatus
from runlog.projections._marker import READY, REBUILDING, Marker
from runlog.projections._state import RunState, WaitInfo
from runlog.schemas import WorkflowSpec


class _Active:
    """The waiting set as Redis keeps it: a ZREM is won once."""

    def __init__(self) -> None:
        self.waiting: dict[str, int] = {}
        self.workflow: dict[str, str] = {}

    def due(self, now_ms: int | None = None) -> list[tuple[str, str]]:
        at = now_ms if now_ms is not None else 10**15
        return [(r, self.workflow.get(r, "")) for r, t in sorted(self.waiting.items(), key=lambda kv: kv[1])
                if t <= at]

    def claim_due(self, run_id: str) -> bool:
        return self.waiting.pop(run_id, None) is not None

    def arm(self, run_id: str, workflow_name: str, deadline_ms: int) -> bool:
        self.workflow[run_id] = workflow_name
        if run_id in self.waiting:
            return False
        self.waiting[run_id] = deadline_ms
        return True


class _Projection:
    def __init__(self, states: list[RunState], state: str = READY) -> None:
        self.states = {s.run_id: s for s in states}
        self.state = state

    def marker(self) -> Marker | None:
        return Marker("g1", self.state)

    def runs(self, status: RunStatus | None = None) -> list[str]:
        return [r for r, s in self.states.items() if status is None or s.status is status]

    def load_states(self, run_ids: list[str]) -> dict[str, RunState]:
        return {r: self.states[r] for r in run_ids if r in self.states}


def _timers(active: _Active, projection: _Projection, requested: list[str]) -> Timers:
    return Timers(active=active, projection=projection, workflows=lambda: ["napper"],  # type: ignore[arg-type]
                  request=lambda run_id, why: requested.append(run_id), metrics=ResumerMetrics())


def _sleeping(run_id: str, wake_ms: int, workflow: str = "napper") -> RunState:
    return RunState(run_id=run_id, status=RunStatus.WAITING, workflow=WorkflowSpec(workflow, "1", ()),
                    waiting=WaitInfo("nap/runlog.sleep/0", "runlog.sleep", wake_ms))


def test_a_due_run_is_requested_by_one_member_only() -> None:
    active, requested = _Active(), []
    active.arm("due", "napper", 1_000)
    active.arm("later", "napper", 9_000)
    active.arm("theirs", "billing", 1_000)
    members = [_timers(active, _Projection([]), requested) for _ in range(3)]
    for m in members:
        m.fire_due(now_ms=5_000)
    assert requested == ["due"]
    assert set(active.waiting) == {"later", "theirs"}


def test_the_index_is_re_armed_from_a_whole_projection_only() -> None:
    states = [_sleeping("a", 5_000), _sleeping("b", 0), _sleeping("c", 7_000, workflow="billing")]
    active, requested = _Active(), []
    rebuilding = _timers(active, _Projection(states, REBUILDING), requested)
    assert rebuilding.restore() == 0 and active.waiting == {}
    ready = _timers(active, _Projection(states), requested)
    assert ready.restore() == 1 and active.waiting == {"a": 5_000}  # b has no deadline, c is not ours
    assert ready.restore() == 0  # already armed
