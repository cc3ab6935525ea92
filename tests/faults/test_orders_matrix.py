"""The crash matrix of a second workflow: an order (quote, reserve, charge, email) started with a run
idempotency key, killed at every boundary of its run and at the run-start points the demo never
stops at, then retried with the same key in a new process and resumed.

Each point gets its own demo world (its own storage), so what happened outside is counted for that
point alone. Checks: the worker died at the point; the retry names the same run; exactly one
``RUN_STARTED``; the run completes (or blocks, only where a ``NEVER`` charge is in doubt); the card
is charged at most once and exactly once when the run completes, the stock reserved once, the
confirmation sent once; every event the killed worker had acknowledged is still on the log; no
``CALL_DIVERGED`` (the stage reads time, randomness and ids through ``ctx``).
"""

from __future__ import annotations

import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from runlog.processors.demo.client import WorldClient
from runlog.processors.demo.run import wait_lease_gone
from runlog.processors.demo.world import serve
from runlog.processors.inspect import run_history
from runlog.producers.run._runs import run_id_for_key
from runlog.schemas import EventType, Settings
from tests.faults.machinery import PointEntry
from tests.faults.machinery.points import boundaries, crash_points, expected_prefix
from tests.faults.machinery.report import write_section
from tests.integration.resume._orders import orders_app, spawn
from tests.integration.resume._workers import finish, resume_after_crash

pytestmark = [pytest.mark.integration, pytest.mark.slow]

START_POINTS = ["before:CLAIM:run", "after:CLAIM:run"]
IN_DOUBT = {"after:EFFECT_INTENT:pay/charge/0", "inside:TOOL:pay/charge/0"}
"""The charge's intent is acknowledged and the worker died before calling: only a person can tell.
(Killed after the charge returned, the ledger holds its external id and resume reuses it.)"""


def _point(settings: Settings, tmp: Path, point: str, ref_events: list,  # type: ignore[type-arg]
           sdk: str) -> PointEntry:
    t0 = time.monotonic()
    entry = PointEntry(point, "FAILED")
    d = tmp / point.replace(":", "_").replace("/", "_")
    d.mkdir(parents=True)
    server = serve(d / "world")
    url = f"http://127.0.0.1:{server.server_address[1]}"
    world = WorldClient(url)
    key = f"order-{uuid.uuid4().hex[:10]}"  # also the order id: each point's effects are its own
    run_id = run_id_for_key(key)
    entry.run_id = run_id
    c = entry.checks
    try:
        crashing = spawn(settings, url, key=key, order=key, mode="ctx", crash_at=point, sdk=sdk)
        rc, _ = finish(crashing, d / "worker.log")
        c["killed_at_point"] = rc == -9
        crashed = [le for le in run_history(settings, run_id) if le.outcome.accepted]
        if point not in START_POINTS:
            want = expected_prefix(point, ref_events)
            entry.lost_events = max(0, want - len(crashed))
            c["acknowledged_events_kept"] = entry.lost_events == 0
        wait_lease_gone(settings, run_id, settings.lease_ttl_ms / 1000 * 6)
        rc, out = finish(spawn(settings, url, key=key, order=key, mode="ctx", sdk=sdk), d / "retry.log")
        c["retry_names_the_same_run"] = rc == 0 and f"run_id={run_id}" in out
        outcome = "completed" if "completed=True" in out else ""
        if not outcome:
            res = resume_after_crash(settings, orders_app(world), run_id)
            outcome = res.result
            entry.detail["resume"] = {"result": res.result, "detail": res.detail[:300],
                                      "effects": [e.action for e in res.plan.effects]}
        history = [le for le in run_history(settings, run_id) if le.outcome.accepted]
        types = [le.event.type for le in history]
        c["one_run_started"] = types.count(EventType.RUN_STARTED) == 1
        c["no_divergence"] = EventType.CALL_DIVERGED not in types
        s = world.stats()
        blocked_ok = point in IN_DOUBT
        entry.completed = outcome in ("completed", "nothing_to_do") and types[-1] is EventType.RUN_COMPLETED
        c["completed_or_blocked_in_doubt"] = entry.completed or (blocked_ok and outcome == "blocked")
        c["charged_at_most_once"] = s["charges"] <= 1
        c["charged_once_when_completed"] = s["charges"] == 1 or not entry.completed
        c["reserved_once"] = s["assets"] == (1 if entry.completed else s["assets"]) and s["assets"] <= 1
        c["emailed_once"] = s["publishes"] == (1 if entry.completed else 0)
        entry.duplicate_effects = sum(max(0, s[k] - 1) for k in ("charges", "assets", "publishes"))
        entry.detail["world"] = {k: s[k] for k in ("charges", "assets", "uploads", "publishes",
                                                   "research_calls")}
        entry.conclude(outcome, t0)
    finally:
        server.shutdown()
        server.server_close()
    return entry


@pytest.mark.parametrize("sdk", ["sync", "async"])
def test_an_order_crashed_at_every_point_is_retried_by_key_and_resumed_once(
        topics: Settings, tmp_path: Path, fault_report: Path, sdk: str) -> None:
    """``sdk``: the workers (crashed and retrying) run the Runner or the AsyncRunner."""
    settings = topics.with_(lease_ttl_ms=1000)
    ref_server = serve(tmp_path / "reference")
    try:
        url = f"http://127.0.0.1:{ref_server.server_address[1]}"
        rc, out = finish(spawn(settings, url, key=f"reference-{sdk}", mode="ctx", sdk=sdk),
                         tmp_path / "reference.log")
        assert rc == 0 and "completed=True" in out, out
    finally:
        ref_server.shutdown()
        ref_server.server_close()
    ref = boundaries([le.event for le in run_history(settings, run_id_for_key(f"reference-{sdk}"))])
    points = START_POINTS + crash_points(ref)
    assert "after:RUN_STARTED:run" in points and "inside:TOOL:pay/charge/0" in points
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="orders") as pool:
        entries = list(pool.map(lambda p: _point(settings, tmp_path, p, ref, sdk), points))
    for e in entries:
        print(f"{e.point:45} {e.outcome:10} {e.seconds:6.2f}s {e.failures or ''}", file=sys.stderr)
    section = "orders_matrix" if sdk == "sync" else "orders_matrix_async"
    write_section(fault_report, section, entries, workflow="orders", sdk=sdk,
                  in_doubt_points=sorted(IN_DOUBT))
    failed = [(e.point, e.failures, e.detail) for e in entries if e.failures]
    assert not failed, failed
    assert sum(e.duplicate_effects + e.lost_events for e in entries) == 0
    assert sum(1 for e in entries if e.completed) == len(points) - len(IN_DOUBT)
