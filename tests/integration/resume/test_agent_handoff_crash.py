"""A sub-agent run as a child run, crashed inside: the durable agents' handoff (OpenAI Agents SDK) and
delegation (Pydantic AI), on the real broker and Redis, with the scripted offline models of
``_handoff_agents.py`` (the companion of the integrations' crash matrix, ``test_agent_crash.py``,
parametrized over the same two integrations).

The parent runs until it hands off: its child run is started and the parent waits (``RUN_WAITING``
for ``runlog.child``). A resumer process takes the child and is SIGKILLed inside the sub-agent (its
first model call and its lookup recorded, its answer not asked yet). Another resumer resumes the
child, then the parent. Checked by counting what the scripted models were asked: every model
request, the parent's and the sub-agent's, was made exactly once (none recorded before the crash is
asked again), the lookup once, the parent's answer is the sub-agent's, both logs link each other,
and the parent's usage rolls its child's up (recorded once on its log).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from runlog.processors.inspect import run_history
from runlog.producers import LocalArtifactStore, Runner
from runlog.projections import RunStatus
from runlog.projections.fold import fold_all
from runlog.schemas import EventType, RunEvent, Settings
from tests.integration.resume._handoff_agents import (
    CHILD_ASKS,
    CHILD_WORKFLOW,
    INTEGRATIONS,
    LOOKUP_DONE,
    PARENT_ASKS,
    TOKENS,
    WORKFLOW,
    World,
    app,
)
from tests.integration.resume._workers import finish, resume_after_crash, spawn_worker

pytestmark = [pytest.mark.integration]

T = EventType


@pytest.fixture(params=INTEGRATIONS)
def integration(request: pytest.FixtureRequest) -> str:
    found: str = request.param
    return found


def _accepted(settings: Settings, run_id: str) -> list[RunEvent]:
    return [le.event for le in run_history(settings, run_id) if le.outcome.accepted]


def test_a_sub_agent_crashed_inside_its_child_run_resumes_without_asking_a_model_again(
        integration: str, topics: Settings, tmp_path: Path) -> None:
    settings = topics.with_(lease_ttl_ms=1000)
    root = tmp_path / "world"
    world = World(root)
    application = app(integration, root)
    wf = application.registry.get(WORKFLOW[integration])
    with Runner.from_settings(settings, source=application.source, prices=application.prices) as runner:
        handle = runner.start_run(wf, {"sku": "sku-1"})
        assert handle.session is not None
        first = runner.execute(handle.session)
    parent_id = handle.run_id
    assert first.waiting == "runlog.child", first  # handed off: the parent waits, holding nothing
    [started] = [e for e in _accepted(settings, parent_id)
                 if e.type is T.TOOL_CALLED and e.tool == "runlog.child"]
    child_id = started.attributes["runlog.child_run_id"]
    child_start = _accepted(settings, child_id)[0]
    assert child_start.type is T.RUN_STARTED and child_start.parent_run_id == parent_id
    assert child_start.workflow is not None and child_start.workflow.name == CHILD_WORKFLOW[integration]
    assert world.asked() == PARENT_ASKS[integration][:1]

    rc, out = finish(spawn_worker("tests.integration.resume._handoff_agents",
                                  [str(root), integration, "resume", child_id], settings,
                                  crash_at=LOOKUP_DONE[integration]), tmp_path / "child-resumer.log")
    assert rc == -9, (rc, out, (tmp_path / "child-resumer.log").read_text()[-2000:])
    at_kill = _accepted(settings, child_id)
    assert at_kill[-1].type is T.TOOL_RESULT
    assert at_kill[-1].call_id == LOOKUP_DONE[integration].split(":", 2)[2]
    assert world.asked() == [*PARENT_ASKS[integration][:1], CHILD_ASKS[0]] and world.lookups() == 1

    child = resume_after_crash(settings, application, child_id)
    assert child.result == "completed", (child.result, child.detail)
    parent = resume_after_crash(settings, application, parent_id)
    assert parent.result == "completed", (parent.result, parent.detail)

    asked = Counter(world.asked())
    assert asked == Counter([*PARENT_ASKS[integration], *CHILD_ASKS]), world.asked()  # each once
    assert world.lookups() == 1
    events = _accepted(settings, parent_id)
    assert events[-1].type is T.RUN_COMPLETED and T.CALL_DIVERGED not in {e.type for e in events}
    verified = next(e for e in events if e.type is T.VERIFIED and e.stage == "ask")
    assert verified.payload_ref is not None
    assert json.loads(LocalArtifactStore(settings.artifact_root).get(verified.payload_ref)) == {
        "answer": "the price is 1200"}
    state = fold_all(events)
    child_state = fold_all(_accepted(settings, child_id))
    assert state is not None and child_state is not None
    assert state.status is RunStatus.COMPLETED and state.children == (child_id,)
    assert child_state.status is RunStatus.COMPLETED and child_state.usage.calls == len(CHILD_ASKS)
    # usage: the parent's own model calls, and its child's rolled up once with the child's outcome
    assert state.usage.calls == len(PARENT_ASKS[integration])
    assert state.children_usage == {child_id: child_state.total_usage}
    assert state.total_usage.calls == len(PARENT_ASKS[integration]) + len(CHILD_ASKS)
    assert state.total_usage.input_tokens == TOKENS[0] * (len(PARENT_ASKS[integration]) + len(CHILD_ASKS))
