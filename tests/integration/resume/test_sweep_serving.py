"""The sweep as the serving loop runs it: against the log when the projection is behind, and once per
interval for the whole group (issue 38)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from runlog.processors.resume import ResumerService
from runlog.producers import DictInputSource, Runner
from runlog.projections import BatchProjector, RawRecord, RedisStore, RunStatus
from runlog.projections.log_reader import read_topic
from runlog.schemas import Codec, EventType, RunEvent, Settings
from tests.integration.resume._toy import toy

pytestmark = pytest.mark.integration


def _complete(settings: Settings, workflow: object, q: str) -> str:
    with Runner.from_settings(settings, source=DictInputSource({})) as runner:
        h = runner.start_run(workflow, {"q": q})  # type: ignore[arg-type]
        assert h.session is not None
        assert runner.execute(h.session).completed
    return h.run_id


def _project_all_but_the_ends(settings: Settings) -> None:
    """What a projector stopped before the runs ended left in Redis: every event but RUN_COMPLETED."""
    codec = Codec()
    proj = BatchProjector(RedisStore.from_settings(settings), codec)
    for batch in read_topic(settings):
        recs = [RawRecord(m.topic(), m.partition(), m.offset(), m.key(), m.value()) for m in batch]
        proj.process([r for r in recs if codec.decode(r.value, RunEvent).type is not EventType.RUN_COMPLETED])


def test_with_no_projector_running_completed_runs_are_not_requested_and_idle_exit_fires(
        topics: Settings) -> None:
    """Issue 38: the projection listed two completed runs ``RUNNING`` (its projector had stopped);
    the sweep requested them every interval and ``--idle-exit`` never fired. The log decides."""
    s = topics.with_(resumer_group=f"t-sweep-{uuid.uuid4().hex[:8]}", sweep_interval_ms=200)
    t = toy(f"ended{uuid.uuid4().hex[:6]}")
    t.crashing = False
    done = [_complete(s, t.workflow, q) for q in ("a", "b")]
    _project_all_but_the_ends(s)
    with ResumerService(s, t.app()) as service:
        assert sorted(service.projection.runs(RunStatus.RUNNING)) == sorted(done)  # stale: no projector
        t0 = time.monotonic()
        handled = service.serve(stop=lambda: time.monotonic() - t0 > 20, idle_exit_s=2.0)
        took = time.monotonic() - t0
        sample = service.metrics.registry.get_sample_value
        sweeps = sample("runlog_resumer_sweeps_total")
        requested = sample("runlog_resumer_sweep_requested_total", {"reason": "lease_expired"}) or 0
        assert sorted(service.sweeper.ended) == sorted(done)
    assert handled == 0
    assert requested == 0, f"{requested} resume requests for runs the log has completed"
    assert sweeps is not None and sweeps >= 3
    assert took < 10, f"--idle-exit did not fire ({took:.1f}s)"


def test_two_members_serving_sweep_once_per_interval_between_them(topics: Settings) -> None:
    """Issue 38, item 6: ``serve()`` sweeps through the group's turn (``sweep_if_turn``, an ``NX`` key),
    not every member every interval."""
    s = topics.with_(resumer_group=f"t-turn-{uuid.uuid4().hex[:8]}", sweep_interval_ms=1000)
    t = toy(f"turn{uuid.uuid4().hex[:6]}")
    members = [ResumerService(s, t.app()) for _ in range(2)]
    try:
        tries = [0, 0]
        for i, m in enumerate(members):
            def counted(interval_ms: int, turn: object = m.sweeper.sweep_turn, i: int = i) -> bool:
                tries[i] += 1
                return bool(turn(interval_ms))  # type: ignore[operator]
            m.sweeper.sweep_turn = counted  # type: ignore[method-assign]
        stop = threading.Event()
        threads = [threading.Thread(target=m.serve, kwargs={"stop": stop.is_set}) for m in members]
        t0 = time.monotonic()
        for th in threads:
            th.start()
        time.sleep(5.0)
        stop.set()
        for th in threads:
            th.join(30)
        elapsed = time.monotonic() - t0
        sweeps = [m.metrics.registry.get_sample_value("runlog_resumer_sweeps_total") or 0 for m in members]
    finally:
        for m in members:
            m.close()
    assert min(tries) >= 3, f"each member asks for the turn every interval: {tries}"
    # a turn lasts interval - 50 ms: at most one sweep per 0.95 s for the whole group
    most = int(elapsed / 0.95) + 1
    assert sum(sweeps) <= most, f"{sweeps} sweeps by two members in {elapsed:.1f}s (at most {most})"
    assert sum(sweeps) >= 3
