"""Double crashes: the worker dies, then the resumer dies again at each step of the resume protocol.

The second crash kills a ``runlog resumer`` subprocess (its request stays
uncommitted in its group); a clean resumer group member then finishes the run,
and every check of the crash matrix must still hold.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest
import redis

from runlog.schemas import Settings
from tests.faults.machinery import CrashMatrix, projection_mismatches, start_projector
from tests.faults.machinery.matrix import describe
from tests.faults.machinery.report import write_section

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PUBLISH = "publish/publish/0"
UPLOAD = "visual/upload/5"
PAIRS = [
    # the platform holds the article, the log only its intent: resume reconciles
    *[(f"before:EFFECT_RESULT:{PUBLISH}", p) for p in (
        "before:LEASE_ACQUIRED:run", "after:LEASE_ACQUIRED:run", f"before:EFFECT_RECONCILED:{PUBLISH}",
        f"after:EFFECT_RECONCILED:{PUBLISH}", f"after:TOOL_RESULT:{PUBLISH}", "before:VERIFIED:publish",
        "before:RUN_COMPLETED:run")],
    # the asset store holds the cover, the log only its intent: resume uploads with the same key
    *[(f"before:EFFECT_RESULT:{UPLOAD}", p) for p in (
        "after:LEASE_ACQUIRED:run", f"before:EFFECT_RESULT:{UPLOAD}", "before:VERIFIED:visual")],
]


def test_a_resume_killed_at_each_protocol_step_is_finished_by_the_group(
    topics: Settings, redis_client: redis.Redis, tmp_path: Path, fault_report: Path
) -> None:
    settings = topics.with_(lease_ttl_ms=1000)
    projector = start_projector(settings, f"{settings.topic_prefix}faults-projector",
                                tmp_path / "projector.log")
    try:
        with CrashMatrix(settings, tmp_path) as m:
            ref = m.reference()
            entries = []
            for first, second in PAIRS:
                e = m.double_crash(first, second, ref)
                print(describe(e), e.detail.get("epochs"), file=sys.stderr, flush=True)
                entries.append(e)
            per_run, _ = projection_mismatches(settings, redis_client, m.run_ids)
    finally:
        projector.send_signal(signal.SIGTERM)
        projector.wait(30)
    for e in entries:
        diff = per_run.get(e.run_id or "", [])
        e.checks["projection_equals_rebuild"] = not diff
        if diff:
            e.projection_mismatches = len(diff)
            e.failures.append("projection_equals_rebuild")
    write_section(fault_report, "double_crash", entries)
    failed = [describe(e) for e in entries if e.failures]
    assert not failed, "\n".join(failed)
    # the second resumer really wrote under a lease of its own before dying (three writers)
    assert any(len(e.detail["epochs"]) == 3 for e in entries)
