"""The resumers' timers: runs whose sleep (``ctx.sleep``) or wait deadline (``ctx.wait_for(...,
timeout=)``) has come are asked to resume, by whichever member is alive then.

The timer index is the writers' waiting set (``P:runs:waiting``, score = the wake time,
:class:`~runlog.producers.internal.ActiveRuns`). Every member looks at it every
:attr:`Timers.interval_s` (a ``ZRANGEBYSCORE``, cheap); a due run is claimed with ``ZREM``, which
only one member wins, so each wake is one resume request however many members look. The index is a
cache of the log like every Redis key: :meth:`Timers.restore` puts back every ``WAITING`` run with a
deadline that the projection (rebuilt from the log) holds and the index lacks (Redis lost, a writer
that died between ``RUN_WAITING`` and its index write). A duplicate request (a run re-armed while its
resume was in flight) costs one resume that finds nothing to do.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from runlog.processors.metrics import ResumerMetrics
from runlog.producers.internal import ActiveRuns
from runlog.projections import RedisStore, RunStatus
from runlog.projections.internal import READY

__all__ = ["Timers"]

log = logging.getLogger("runlog.resumer")


class Timers:
    """Wakes the runs of one App's workflows whose wake time (or wait deadline) has come.

    Args:
        active: the waiting set (the timer index) and the runs' workflow names.
        projection: the projection store, to re-arm the index from (:meth:`restore`).
        workflows: the workflow names this App registers.
        request: appends a resume request for a run, with its reason.
        metrics: counts the requests (``runlog_resumer_sweep_requested_total{reason="timer_due"}``).
        interval_s: how often :meth:`tick` looks for due timers.
        restore_every_s: how often :meth:`tick` re-arms the index from the projection.
    """

    def __init__(self, *, active: ActiveRuns, projection: RedisStore, workflows: Callable[[], Iterable[str]],
                 request: Callable[[str, str], None], metrics: ResumerMetrics, interval_s: float = 0.25,
                 restore_every_s: float = 30.0) -> None:
        self.active = active
        self.projection = projection
        self.workflows = workflows
        self.request = request
        self.metrics = metrics
        self.interval_s = interval_s
        self.restore_every_s = restore_every_s
        self._last_fire = 0.0
        self._last_restore: float | None = None

    def fire_due(self, now_ms: int | None = None) -> list[str]:
        """Request the resume of every due run of this App that this member claims; their ids."""
        mine = set(self.workflows())
        fired: list[str] = []
        for run_id, workflow in self.active.due(now_ms):
            if workflow not in mine or not self.active.claim_due(run_id):
                continue  # another App's run, or another member claimed it first
            self.request(run_id, "timer due")
            self.metrics.sweep_requested.labels("timer_due").inc()
            fired.append(run_id)
        return fired

    def restore(self) -> int:
        """Re-arm the index from the projection: every ``WAITING`` run of this App with a deadline
        that the index lacks; how many were missing. Nothing while the projection is not whole
        (a rebuild, a swap or a replay moves its indexes)."""
        marker = self.projection.marker()
        if marker is None or marker.state != READY:
            return 0
        mine = set(self.workflows())
        waiting = self.projection.runs(RunStatus.WAITING)
        armed = 0
        for run_id, state in self.projection.load_states(waiting).items():
            w, wf = state.waiting, state.workflow
            if state.status is not RunStatus.WAITING or w is None or w.deadline_ms <= 0 \
                    or wf is None or wf.name not in mine:
                continue
            if self.active.arm(run_id, wf.name, w.deadline_ms):
                armed += 1
        if armed:
            log.info("timers: re-armed %d waiting run(s) from the projection", armed)
        return armed

    def tick(self) -> list[str]:
        """What the serving loop calls each turn: :meth:`restore` first and then every
        :attr:`restore_every_s`, :meth:`fire_due` every :attr:`interval_s`."""
        now = time.monotonic()
        if self._last_restore is None or now - self._last_restore >= self.restore_every_s:
            self._last_restore = now
            self.restore()
        if now - self._last_fire < self.interval_s:
            return []
        self._last_fire = now
        return self.fire_due()
