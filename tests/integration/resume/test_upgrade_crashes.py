"""``runlog upgrade`` of runs killed (SIGKILL, a worker process) at every stage boundary and at
crash points inside stages and effects.

The orders workflow (pick: SAFE quote + IDEMPOTENT reserve; pay: NEVER charge; notify:
RECONCILE_FIRST email; version 2 changes notify's text) runs in a worker process that kills itself
at a point of its write path; the run is then upgraded to version 2. Each run completes, no stage
before the kept checkpoint starts again, no tool of a kept stage is called again, every effect
happened once in the demo world's own storage, and the dry run's plan is the real one's. A run
killed inside its charge (the charge in doubt) is refused until a person decides it.
Real broker, Redis, demo world and worker processes.
"""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import pytest

from runlog.processors.demo.run import wait_lease_gone
from runlog.processors.operate import OperatorRefused
from runlog.processors.resume import Resumer
from runlog.processors.upgrade import upgrade_run
from runlog.producers.run._runs import run_id_for_key
from runlog.projections import RunStatus
from runlog.schemas import EventType, Settings
from tests.integration.resume._orders import orders_app, spawn
from tests.integration.resume._workers import finish
from tests.integration.resume.conftest import DemoWorld, accepted, log_of

pytestmark = pytest.mark.integration

STAGES = ("pick", "pay", "notify")

# point -> the stages verified before the kill
POINTS: dict[str, tuple[str, ...]] = {
    # the stage boundaries: before the first stage, after each verified stage
    "after:RUN_STARTED:run": (),
    "after:VERIFIED:pick": ("pick",),
    "after:VERIFIED:pay": ("pick", "pay"),
    "before:RUN_COMPLETED:run": STAGES,
    # inside stages and effects
    "inside:STAGE:pay": ("pick",),
    "inside:TOOL:pick/reserve/1": (),  # the reservation's intent confirmed, the tool not entered
    "before:EFFECT_RESULT:pick/reserve/1": (),  # reserved, its result not recorded
    "before:EFFECT_RESULT:pay/charge/0": ("pick",),  # charged, its result not recorded
    "inside:TOOL:notify/email/0": ("pick", "pay"),  # the email's intent confirmed, not sent
    "before:EFFECT_RESULT:notify/email/0": ("pick", "pay"),  # sent, its result not recorded
}


def _killed(settings: Settings, world: DemoWorld, tmp: Path, point: str, order: str) -> str:
    key = f"upgrade-{uuid.uuid4().hex}"  # names the run even when the worker dies before printing it
    rc, out = finish(spawn(settings, world.url, key=key, order=order, mode="fixed", crash_at=point),
                     tmp / f"worker-{uuid.uuid4().hex[:6]}.log")
    assert rc == -9, f"worker for {point} exited {rc}, not killed:\n{out}"
    run_id = run_id_for_key(key)
    wait_lease_gone(settings, run_id, settings.lease_ttl_ms / 1000 * 4)
    return run_id


@pytest.mark.parametrize("point", list(POINTS))
def test_a_run_killed_at_a_boundary_or_inside_an_effect_is_upgraded_once_and_exactly(
        topics: Settings, world: DemoWorld, tmp_path: Path, point: str) -> None:
    order = f"k-{point.split(':')[0]}-{uuid.uuid4().hex[:4]}"
    run_id = _killed(topics, world, tmp_path, point, order)
    verified = POINTS[point]
    before = accepted(log_of(topics, run_id))
    assert [e.event.stage for e in before if e.event.type is EventType.VERIFIED] == list(verified), point
    both = orders_app(world.client, versions=("1", "2"))
    dry = upgrade_run(topics, both, run_id, "2", by="ops", reason="thank the customer", dry_run=True)
    assert dry.outcome is None and dry.plan.changed_stages == ("notify",)
    # notify changed: the latest checkpoint among the unchanged stages is kept
    kept = tuple(s for s in verified if s != "notify")
    assert dry.plan.kept_stages == kept, (point, dry.plan)
    assert len(log_of(topics, run_id)) == len(before)  # the dry run appended nothing
    real = upgrade_run(topics, both, run_id, "2", by="ops", reason="thank the customer")
    assert real.plan == dry.plan, point
    assert real.outcome is not None and real.outcome.result == "completed", (point, real.outcome)
    rerun = tuple(s for s in STAGES if s not in kept)
    assert real.executed_stages == real.plan.rerun_stages == rerun, point

    after = [le.event for le in accepted(log_of(topics, run_id))[len(before):]]
    assert [e.type for e in after].count(EventType.RUN_UPGRADED) == 1
    started = [e.stage for e in after if e.type is EventType.STAGE_STARTED]
    assert started == list(rerun), (point, started)  # no kept stage started again
    called = {e.call_id.split("/")[0] for e in after if e.type is EventType.TOOL_CALLED and e.call_id}
    assert not called & set(kept), (point, called)  # no tool of a kept stage called again
    with Resumer(topics, both) as r:
        state = r.load(run_id)[0]
    assert state.status is RunStatus.COMPLETED and state.workflow is not None
    assert state.workflow.version == "2"

    stats = world.stats()
    assert (stats["charges"], stats["charged_references"], stats["assets"], stats["publishes"]) == \
        (1, 1, 1, 1), (point, stats)
    with sqlite3.connect(tmp_path / "world" / "platform.db") as db:
        bodies = [b for (b,) in db.execute("SELECT body FROM articles")]
    assert len(bodies) == 1, (point, bodies)
    # an email version 1 sent before the kill is handed back, never sent again in version 2's words
    sent_by_v1 = point in ("before:EFFECT_RESULT:notify/email/0", "before:RUN_COMPLETED:run")
    assert ("thank you" in bodies[0]) != sent_by_v1, (point, bodies)


def test_a_run_killed_inside_its_charge_is_refused_until_the_charge_is_decided(
        topics: Settings, world: DemoWorld, tmp_path: Path) -> None:
    run_id = _killed(topics, world, tmp_path, "inside:TOOL:pay/charge/0", "k-doubt")
    n = len(log_of(topics, run_id))
    both = orders_app(world.client, versions=("1", "2"))
    for dry_run in (True, False):
        with pytest.raises(OperatorRefused, match=r"in doubt.*runlog resolve"):
            upgrade_run(topics, both, run_id, "2", by="ops", reason="x", dry_run=dry_run)
    assert len(log_of(topics, run_id)) == n  # refused: nothing appended
    assert world.stats()["charges"] == 0
