"""The fold of a durable wait: RUN_WAITING makes the run WAITING with what it waits for; the signal is
the wait's recorded result, and the state (JSON round trip included) keeps the deadline."""

from __future__ import annotations

from runlog.projections import RunStatus, fold_all
from runlog.projections._state import CallStatus, WaitInfo, state_from_json, state_to_json
from runlog.schemas import EventType, ReplayPolicy

from .runlogs import RunBuilder, art


def test_a_wait_then_its_signal() -> None:
    b = RunBuilder("r-wait").start()
    b.add(EventType.STAGE_STARTED, stage="research")
    common = {"stage": "research", "tool": "runlog.wait", "call_id": "research/runlog.wait/0",
              "replay_policy": ReplayPolicy.SAFE}
    b.add(EventType.TOOL_CALLED, payload_ref=art("args"), request_hash="h", **common)
    b.add(EventType.RUN_WAITING, attributes={"signal": "approval", "deadline_ms": "1234"}, **common)
    waiting = fold_all(b.events)
    assert waiting is not None and waiting.status is RunStatus.WAITING
    assert waiting.waiting == WaitInfo("research/runlog.wait/0", "approval", 1234)
    assert state_from_json(state_to_json(waiting)) == waiting
    b.lease(2)
    b.add(EventType.SIGNAL_RECEIVED, payload_ref=art("data"), attributes={"signal": "approval", "by": "a"},
          **common)
    done = fold_all(b.events)
    assert done is not None and done.status is RunStatus.RUNNING and done.waiting is None
    call = done.calls["research/runlog.wait/0"]
    assert call.status is CallStatus.RESULT and call.result == art("data")


def test_a_state_written_before_waits_existed_loads() -> None:
    s = fold_all(RunBuilder("r-old").start().events)
    assert s is not None
    text = state_to_json(s).replace(',"waiting":null', "")
    assert '"waiting"' not in text
    assert state_from_json(text).waiting is None
