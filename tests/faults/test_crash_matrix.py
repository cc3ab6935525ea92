"""The crash matrix: the demo worker SIGKILLed at every boundary of its run, resumed by the group.

Every point must end with the run completed (or, for a death before ``RUN_STARTED``
was acknowledged, with no run and an untouched world), one article, three
renders billed, three assets, no ``NEVER`` tool run, final artifacts equal to an
uncrashed run's, search re-run only where its result was never recorded, no
acknowledged event lost, and a Redis projection equal to a rebuild from the log.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest
import redis

from runlog.processors.demo.client import WorldClient
from runlog.processors.demo.pipeline import BRIEFS
from runlog.schemas import EventType, Settings
from tests.faults.machinery import (
    CrashMatrix,
    PointEntry,
    crash_points,
    projection_mismatches,
    start_projector,
)
from tests.faults.machinery.matrix import describe
from tests.faults.machinery.report import write_section

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _print(e: PointEntry) -> None:
    print(describe(e), file=sys.stderr, flush=True)


@pytest.mark.parametrize("sdk", ["sync", "async"])
def test_every_crash_point_resumes_to_the_uncrashed_result(
    topics: Settings, redis_client: redis.Redis, tmp_path: Path, fault_report: Path, sdk: str
) -> None:
    """``sdk``: the workers run the Runner, or the AsyncRunner on an asyncio loop (same points)."""
    # a killed worker's lease must expire before the group resumes its run, so the TTL is short; 1 s
    # was too short for a live worker on a CI host at load 8 (its heartbeat starved past the TTL, the
    # run was lost to the worker before the kill point: a failure of the host, not of the point)
    settings = topics.with_(lease_ttl_ms=2000)
    projector = start_projector(settings, f"{settings.topic_prefix}faults-projector",
                                tmp_path / "projector.log")
    try:
        with CrashMatrix(settings, tmp_path, sdk=sdk) as m:
            ref = m.reference()
            assert ref.stats["publishes"] == 1 and ref.stats["renders_billed"] == 3
            # Search drifts: a worker killed after the search answered but before its TOOL_RESULT
            # was acknowledged leaves nothing to reuse, so resume runs the SAFE search again and sees
            # a newer index. Its result must equal an uncrashed run in a world searched once before.
            searches = [b.call_id for b in ref.events if b.type is EventType.TOOL_CALLED
                        and b.call_id and b.stage == "research"]
            rerun_search = {f"before:TOOL_RESULT:{c}" for c in searches}
            topic = BRIEFS["v1"]["topic"]
            drifted = m.reference("reference-drifted",
                                  prepare=lambda w: WorldClient.post(w, "/search", {"query": topic}))
            assert drifted.hashes != ref.hashes  # the drift is real, so the comparison means something

            def allow(point: str) -> tuple[int, dict[str, str] | None]:
                return (2, drifted.hashes) if point in rerun_search else (1, None)

            points = crash_points(ref.events)
            assert len(points) >= 80, points
            entries = m.run_points(points, ref, concurrency=2, allow=allow, progress=_print)
            per_run, global_diff = projection_mismatches(settings, redis_client, m.run_ids)
    finally:
        projector.send_signal(signal.SIGTERM)
        projector.wait(30)
    for e in entries:
        if e.run_id is not None and per_run.get(e.run_id):
            e.projection_mismatches = len(per_run[e.run_id])
            e.failures.append("projection_equals_rebuild")
            e.detail["projection_diff"] = per_run[e.run_id]
        e.checks["projection_equals_rebuild"] = not (e.run_id and per_run.get(e.run_id))
    section = "crash_matrix" if sdk == "sync" else "crash_matrix_async"
    doc = write_section(fault_report, section, entries, reference_run=ref.run_id,
                        search_rerun_allowed_at=sorted(rerun_search),
                        global_index_differences=global_diff)
    failed = [describe(e) for e in entries if e.failures]
    assert not failed, "\n".join(failed)
    assert doc["sections"][section]["points"]
    assert sum(e.duplicate_effects + e.duplicate_renders + e.lost_events for e in entries) == 0
    assert sum(1 for e in entries if e.completed) == sum(1 for e in entries if e.outcome != "no_run")
    assert not [k for k in global_diff if k.startswith("runs:by_status:")], global_diff
