"""The crash matrix of a durable Pydantic AI agent: a worker running the two-stage ``agent-shop``
workflow (tests/integration/resume/_pydantic_ai_agent.py) is SIGKILLed at every boundary of every
model request and tool call, then the run is resumed by a resumer.

Each point gets its own world (files and SQLite database), so what happened outside is counted for
that point alone. Checks: the worker died at the point; the resume completed the run with the
reference run's answer and no ``CALL_DIVERGED``; every model request whose result the log recorded
before the crash was made exactly once (read back on resume, never asked again) and every other at
most twice (the one in flight is asked again); the same for the SAFE lookup; the effect (one row,
unique by delivery key) happened exactly once and was entered exactly once. Workers alternate
between the sync ``Runner`` and the ``AsyncRunner``.
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from runlog.processors.demo.run import wait_lease_gone
from runlog.processors.inspect import run_history
from runlog.processors.resume import Resumer
from runlog.producers import LocalArtifactStore
from runlog.schemas import EventType, RunEvent, Settings
from tests.faults.machinery.points import boundaries, crash_points
from tests.integration.resume._pydantic_ai_agent import (
    LOOKUP_TOOL,
    MODEL_TOOL,
    SAVE_TOOL,
    ShopWorld,
    agent_app,
    spawn,
)
from tests.integration.resume._workers import finish

pytestmark = [pytest.mark.integration, pytest.mark.slow]

T = EventType


def _accepted(settings: Settings, run_id: str) -> list[RunEvent]:
    return [le.event for le in run_history(settings, run_id) if le.outcome.accepted]


def _run_id(out: str) -> str:
    return next(line.split("=", 1)[1] for line in out.splitlines() if line.startswith("run_id="))


def _point(settings: Settings, tmp: Path, i: int, point: str, turns: dict[str, int]) -> dict[str, Any]:
    t0 = time.monotonic()
    d = tmp / f"{i:02d}-{point.replace(':', '_').replace('/', '_')}"
    c: dict[str, bool] = {}
    detail: dict[str, Any] = {"point": point, "checks": c}
    order = f"o-{i}"  # each point's effect is its own (the effects ledger is shared by all runs)
    rc, out = finish(spawn(settings, d / "world", order=order, sdk="async" if i % 2 else "sync",
                           crash_at=point), d / "worker.log")
    c["killed_at_point"] = rc == -9
    detail["worker_rc"] = rc  # not -9: the worker log (worker.log) says why
    run_id = _run_id(out)
    crashed = _accepted(settings, run_id)
    recorded = {e.call_id for e in crashed if e.type is T.TOOL_RESULT}
    wait_lease_gone(settings, run_id, settings.lease_ttl_ms / 1000 * 6)
    with Resumer(settings, agent_app(d / "world")) as r:
        res = r.resume(run_id)
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
    lookup_recorded = any(cid and LOOKUP_TOOL in cid for cid in recorded)
    c["lookup_once_if_recorded"] = world.lookups() == 1 if lookup_recorded else 1 <= world.lookups() <= 2
    c["one_row"] = len(world.rows()) == 1
    c["effect_entered_once"] = world.attempts() == 1
    detail["seen"] = {"model_turns": asked, "lookups": world.lookups(), "attempts": world.attempts(),
                      "rows": len(world.rows())}
    detail["seconds"] = round(time.monotonic() - t0, 2)
    detail["failures"] = sorted(k for k, ok in c.items() if not ok)
    return detail


def test_a_durable_agent_crashed_at_every_call_boundary_resumes_without_repeating(
        topics: Settings, tmp_path: Path) -> None:
    settings = topics.with_(lease_ttl_ms=1000)
    rc, out = finish(spawn(settings, tmp_path / "reference" / "world", order="reference"),
                     tmp_path / "reference.log")
    assert rc == 0 and "completed=True" in out, out
    ref = _accepted(settings, _run_id(out))
    called = [e for e in ref if e.type is T.TOOL_CALLED]
    assert [e.tool for e in called] == [MODEL_TOOL, LOOKUP_TOOL, MODEL_TOOL, MODEL_TOOL, SAVE_TOOL,
                                        MODEL_TOOL]
    turns = {e.call_id or "": n for n, e in enumerate(e for e in called if e.tool == MODEL_TOOL)}
    ref_world = ShopWorld(tmp_path / "reference" / "world")
    assert ref_world.model_turns() == [0, 1, 2, 3] and ref_world.attempts() == 1
    points = [p for p in crash_points(boundaries(ref)) if "/" in p.split(":", 2)[2]]
    assert len(points) == 4 * 5 + 5 + 9  # model requests and the lookup: 5 points each, the effect 9
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="agent-crash") as pool:
        entries = list(pool.map(lambda ip: _point(settings, tmp_path, ip[0], ip[1], turns),
                                enumerate(points)))
    for e in entries:
        print(f"{e['point']:60} {e['resume'][0]:10} {e['resume'][2]} {e['seen']} {e['seconds']:5.2f}s "
              f"{e['failures'] or ''}", file=sys.stderr)
    failed = [e for e in entries if e["failures"]]
    assert not failed, failed
    # the kills landed where they say: a request in flight (asked, no result logged) is asked again,
    # nothing else is; the effect's intent without result is rerun or found done by reconcile
    asked_twice = {e["point"] for e in entries if len(e["seen"]["model_turns"]) > 4}
    assert asked_twice == {f"before:TOOL_RESULT:{cid}" for cid in turns}
    actions = {e["point"].split(":")[0] + ":" + e["point"].split(":")[1]: e["resume"][2] for e in entries
               if SAVE_TOOL in e["point"]}
    assert actions["after:EFFECT_INTENT"] == ["rerun"] and actions["inside:TOOL"] == ["rerun"]
    assert actions["before:EFFECT_RESULT"] == ["reconciled"]
