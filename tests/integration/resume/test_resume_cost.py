"""Resume cost: with 100,000 events before the last checkpoint, resume reads only the tail."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from runlog.processors.resume import App, Resumer
from runlog.producers import DictInputSource, LocalArtifactStore, Workflow, rule
from runlog.producers.run._core import STAGE_OUTPUT_MEDIA_TYPE
from runlog.projections import rebuild
from runlog.schemas import EventType, ReplayPolicy, RuleResult, RunEvent, Settings
from tests.integration.processors.harness import produce

pytestmark = pytest.mark.integration

HISTORY = 100_000
"""Events before the last checkpoint's VERIFIED."""
TAIL = 20


def _workflow() -> Workflow:
    wf = Workflow("long", version="1")

    @wf.stage("collect", rules=[rule("n == 1", lambda out: out["n"] == 1)])
    def collect(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"n": 1}

    @wf.stage("finish")
    def finish(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"done": True}

    return wf


def _events(run_id: str, wf: Workflow, settings: Settings) -> list[RunEvent]:
    store = LocalArtifactStore(settings.artifact_root)
    params = store.put(b"{}", "application/json")
    out = store.put(b'{"n":1}', STAGE_OUTPUT_MEDIA_TYPE)
    t = int(time.time() * 1000)
    evs = [RunEvent(run_id, 1, 1, EventType.RUN_STARTED, t, workflow=wf.spec(), payload_ref=params),
           RunEvent(run_id, 2, 1, EventType.STAGE_STARTED, t, stage="collect")]
    seq = 3
    while seq <= HISTORY:
        call = f"collect/probe/{(seq // 2) % 16}"
        kind = EventType.TOOL_CALLED if seq % 2 else EventType.TOOL_RESULT
        evs.append(RunEvent(run_id, seq, 1, kind, t, stage="collect", tool="probe", call_id=call,
                            replay_policy=ReplayPolicy.SAFE))
        seq += 1
    evs.append(RunEvent(run_id, seq, 1, EventType.VERIFIED, t, stage="collect", payload_ref=out,
                        artifact_refs=(out,), verification=(RuleResult("n == 1", True),)))
    seq += 1
    evs.append(RunEvent(run_id, seq, 1, EventType.STAGE_STARTED, t, stage="finish"))
    for i in range(TAIL - 1):
        seq += 1
        kind = EventType.TOOL_CALLED if i % 2 == 0 else EventType.TOOL_RESULT
        evs.append(RunEvent(run_id, seq, 1, kind, t, stage="finish", tool="probe",
                            call_id=f"finish/probe/{i // 2}", replay_policy=ReplayPolicy.SAFE))
    return evs


def test_resume_after_a_long_history_reads_only_the_tail(topics: Settings) -> None:
    wf = _workflow()
    run_id = f"run-long-{uuid.uuid4().hex[:8]}"
    events = _events(run_id, wf, topics)
    assert len(events) == HISTORY + 1 + TAIL
    produce(topics, events)

    # the projections, rebuilt from the log into their own prefix (checkpoint snapshots included)
    prefix = f"{topics.redis_prefix}:rebuilt"
    report = rebuild(topics, prefix, progress=None)
    assert report.records == len(events)
    app = App.of([wf], [], DictInputSource({}))

    with Resumer(topics.with_(redis_prefix=prefix), app) as r:
        out = r.resume(run_id, dry_run=True)

    plan = out.plan
    print(f"resume read {plan.events_read} events of a run with {len(events)}")
    assert out.result == "planned"
    assert plan.checkpoint is not None and plan.checkpoint.stage == "collect"
    assert plan.checkpoint.last_seq == HISTORY + 1
    assert plan.from_stage == "finish"
    assert plan.blocked_reason is None
    assert plan.events_read == TAIL  # the tail after the checkpoint, nothing of the 100,000 before
    assert plan.events_read <= 30
