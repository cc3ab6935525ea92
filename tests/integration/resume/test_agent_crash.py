"""The crash matrix of a durable agent, run against each integration (OpenAI Agents SDK, Pydantic
AI): a worker running the two-stage shop workflow (tests/integration/resume/_shop_world.py, built on
the integration by ``_openai_agents_agent.py`` and ``_pydantic_ai_agent.py``) is SIGKILLed at every
boundary of every model call and tool call, then the run is resumed by a resumer.

Each point gets its own world (files and SQLite database), so what happened outside is counted for
that point alone. Checks: the worker died at the point; the resume completed the run with the
reference run's answer and no ``CALL_DIVERGED``; every model call whose result the log recorded
before the crash was made exactly once (read back on resume, never asked again) and every other at
most twice (the one in flight is asked again); the same for the SAFE lookup; the effect (one row,
unique by delivery key) happened exactly once and was entered exactly once; the run's token totals
are the reference run's plus, at most, the one call in flight at the kill. Workers alternate
between the sync ``Runner`` and the ``AsyncRunner``.

A sub-agent run as a child run (an OpenAI Agents SDK handoff, a Pydantic AI delegation) crashed
inside is the companion suite ``test_agent_handoff_crash.py``, parametrized over the same two
integrations (kept apart: it is fast, this one is slow).
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from runlog.processors.inspect import run_history
from runlog.producers import LocalArtifactStore
from runlog.projections import RunStatus
from runlog.projections.fold import fold_all
from runlog.schemas import EventType, RunEvent, Settings
from tests.faults.machinery.points import boundaries, crash_points
from tests.integration.resume._openai_agents_agent import SHOP as OPENAI_AGENTS
from tests.integration.resume._pydantic_ai_agent import SHOP as PYDANTIC_AI
from tests.integration.resume._shop_world import Shop, ShopWorld
from tests.integration.resume._workers import finish, resume_after_crash

pytestmark = [pytest.mark.integration, pytest.mark.slow]

T = EventType


@pytest.fixture(params=[OPENAI_AGENTS, PYDANTIC_AI], ids=lambda shop: shop.integration)
def shop(request: pytest.FixtureRequest) -> Shop:
    """The shop on one integration."""
    found: Shop = request.param
    return found


def _accepted(settings: Settings, run_id: str) -> list[RunEvent]:
    return [le.event for le in run_history(settings, run_id) if le.outcome.accepted]


def _run_id(out: str) -> str:
    return next(line.split("=", 1)[1] for line in out.splitlines() if line.startswith("run_id="))


def _point(shop: Shop, settings: Settings, tmp: Path, i: int, point: str,
           turns: dict[str, int]) -> dict[str, Any]:
    t0 = time.monotonic()
    d = tmp / f"{i:02d}-{point.replace(':', '_').replace('/', '_')}"
    c: dict[str, bool] = {}
    detail: dict[str, Any] = {"point": point, "checks": c}
    order = f"o-{i}"  # each point's effect is its own (the effects ledger is shared by all runs)
    rc, out = finish(shop.spawn(settings, d / "world", order=order, sdk="async" if i % 2 else "sync",
                                crash_at=point), d / "worker.log")
    c["killed_at_point"] = rc == -9
    detail["worker_rc"] = rc
    if rc != -9:  # the worker ended some other way: its last lines say why
        detail["worker_log"] = (d / "worker.log").read_text()[-1500:]
    run_id = _run_id(out)
    crashed = _accepted(settings, run_id)
    recorded = {e.call_id for e in crashed if e.type is T.TOOL_RESULT}
    res = resume_after_crash(settings, shop.app(d / "world"), run_id)
    detail["resume"] = (res.result, res.detail[:300], [e.action for e in res.plan.effects])
    evs = _accepted(settings, run_id)
    types = [e.type for e in evs]
    c["completed"] = res.result == "completed" and types[-1] is T.RUN_COMPLETED
    c["no_divergence"] = T.CALL_DIVERGED not in types
    outputs = [e for e in evs if e.type is T.VERIFIED and e.stage == "order"]
    ref = outputs[-1].payload_ref if outputs else None
    c["same_answer"] = ref is not None and json.loads(LocalArtifactStore(settings.artifact_root).get(ref)) \
        == {"answer": f"saved row-{order}"}
    world = ShopWorld(d / "world")
    asked = world.model_turns()
    for call_id, turn in turns.items():
        n = asked.count(turn)
        want_once = call_id in recorded
        c[f"model {call_id} {'once' if want_once else '<=2'}"] = n == 1 if want_once else 1 <= n <= 2
    lookup_recorded = any(cid and shop.lookup_tool in cid for cid in recorded)
    c["lookup_once_if_recorded"] = world.lookups() == 1 if lookup_recorded else 1 <= world.lookups() <= 2
    c["one_row"] = len(world.rows()) == 1
    c["effect_entered_once"] = world.attempts() == 1
    state = fold_all(evs)
    detail["usage"] = None if state is None else (state.usage.calls, state.usage.input_tokens)
    detail["seen"] = {"model_turns": asked, "lookups": world.lookups(), "attempts": world.attempts(),
                      "rows": len(world.rows())}
    detail["seconds"] = round(time.monotonic() - t0, 2)
    detail["failures"] = sorted(k for k, ok in c.items() if not ok)
    return detail


def test_a_durable_agent_crashed_at_every_call_boundary_resumes_without_repeating(
        shop: Shop, topics: Settings, tmp_path: Path) -> None:
    settings = topics.with_(lease_ttl_ms=2000)  # a worker's heartbeat outlives a loaded machine's stalls
    rc, out = finish(shop.spawn(settings, tmp_path / "reference" / "world", order="reference"),
                     tmp_path / "reference.log")
    assert rc == 0 and "completed=True" in out, out
    ref = _accepted(settings, _run_id(out))
    called = [e for e in ref if e.type is T.TOOL_CALLED]
    model, lookup, save = shop.model_tool, shop.lookup_tool, shop.save_tool
    assert [e.tool for e in called] == [model, lookup, model, model, save, model]
    turns = {e.call_id or "": n for n, e in enumerate(e for e in called if e.tool == model)}
    ref_world = ShopWorld(tmp_path / "reference" / "world")
    assert ref_world.model_turns() == [0, 1, 2, 3] and ref_world.attempts() == 1
    ref_state = fold_all(ref)
    assert ref_state is not None and ref_state.usage.calls == 4
    assert ref_state.usage.input_tokens == 500 + 600 + 700 + 800 and ref_state.usage.cost_nanos == (
        2600 * 2000 + 4 * 20 * 8000)  # priced by the App's table: 2 and 8 $ per M tokens
    points = [p for p in crash_points(boundaries(ref)) if "/" in p.split(":", 2)[2]]
    assert len(points) == 4 * 5 + 5 + 9  # model calls and the lookup: 5 points each, the effect 9
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="agent-crash") as pool:
        entries = list(pool.map(lambda ip: _point(shop, settings, tmp_path, ip[0], ip[1], turns),
                                enumerate(points)))
    for e in entries:
        print(f"{e['point']:60} {e['resume'][0]:10} {e['resume'][2]} {e['seen']} {e['usage']} "
              f"{e['seconds']:5.2f}s {e['failures'] or ''}", file=sys.stderr)
    failed = [e for e in entries if e["failures"]]
    assert not failed, failed
    # the kills landed where they say: a call in flight (asked, no result logged) is asked again,
    # nothing else is; the effect's intent without result is rerun or found done by reconcile
    asked_twice = {e["point"] for e in entries if len(e["seen"]["model_turns"]) > 4}
    assert asked_twice == {f"before:TOOL_RESULT:{cid}" for cid in turns}
    # spend: each model call recorded once; a call asked twice was paid twice, recorded once
    assert all(e["usage"] == (4, 2600) for e in entries), [e["usage"] for e in entries]
    actions = {e["point"].split(":")[0] + ":" + e["point"].split(":")[1]: e["resume"][2] for e in entries
               if save in e["point"]}
    assert actions["after:EFFECT_INTENT"] == ["rerun"] and actions["inside:TOOL"] == ["rerun"]
    assert actions["before:EFFECT_RESULT"] == ["reconciled"]


def test_a_resume_on_changed_instructions_diverges_and_blocks_with_the_reason(
        shop: Shop, topics: Settings, tmp_path: Path) -> None:
    """Killed after the research stage's last model call (before the stage is verified); resumed by
    code whose agent has other instructions: the recorded call is not handed to the changed request,
    the run blocks, its ``RUN_BLOCKED`` names the call, nothing is asked of the model again and no
    row is written."""
    settings = topics.with_(lease_ttl_ms=1000)
    world_dir = tmp_path / "world"
    model = shop.model_tool
    point = f"after:TOOL_RESULT:research/{model}/2"
    rc, out = finish(shop.spawn(settings, world_dir, order="o-div", crash_at=point), tmp_path / "worker.log")
    assert rc == -9, out
    run_id = _run_id(out)
    changed = shop.app(world_dir, instructions="Look prices up, save, and be brief.")
    res = resume_after_crash(settings, changed, run_id)
    assert res.result == "blocked", (res.result, res.detail)
    evs = _accepted(settings, run_id)
    [diverged] = [e for e in evs if e.type is T.CALL_DIVERGED]
    assert diverged.call_id == f"research/{model}/0"
    blocked = evs[-1]
    assert blocked.type is T.RUN_BLOCKED and blocked.error is not None
    assert f"research/{model}/0" in blocked.error.message and "diverged" in blocked.error.message
    state = fold_all(evs)
    assert state is not None and state.status is RunStatus.BLOCKED
    world = ShopWorld(world_dir)
    assert world.model_turns() == [0, 1] and world.lookups() == 1 and world.rows() == []
