"""The resumer's sweep: the runs of its App's workflows whose writer is gone (their lease expired) get
a resume request, and waits whose deadline passed are handed to their policy. Candidates are the
writers' active set and, when the projection is whole (marker ``ready``), its ``RUNNING`` index; while
a rebuild, a swap or a replay moves the indexes, only the active set is swept. A whole projection may
still be behind the log (no projector running, or one lagging): a run only its index lists is read on
the log before it is requested, and requested only when the log has it ``RUNNING`` (a run the log has
ended is remembered and not read again). The serving loop sweeps
when it holds the group's turn (:meth:`Sweeper.sweep_turn`): one member per interval, however many the
group has. :class:`Sweeper` is the part of :class:`~runlog.processors.resume.service.ResumerService`
that does this; it asks for resumes through the callable it is given."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import redis

from runlog.processors.metrics import ResumerMetrics
from runlog.processors.resume._versions import VersionRoutes
from runlog.producers.internal import CHILD, ActiveRuns
from runlog.projections import RedisStore, RunStatus
from runlog.projections.internal import READY

__all__ = ["CHILD_ENDED", "ENDED", "SweepReport", "Sweeper"]

log = logging.getLogger("runlog.resumer")

ENDED = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})
"""Statuses a run the log has ended holds: the sweep remembers such a run and reads it no more."""

CHILD_ENDED = frozenset({*ENDED, RunStatus.BLOCKED})
"""Statuses of a child run its waiting parent is woken for (a blocked child blocks the parent)."""

REMEMBERED_MAX = 100_000
"""Ended runs the sweep remembers at most (beyond: forgotten, read on the log again when listed)."""


@dataclass
class SweepReport:
    requested: list[str] = field(default_factory=list)
    alive: int = 0
    ended: list[str] = field(default_factory=list)
    """Runs the projection's index lists ``RUNNING`` that the log has ended or does not hold (the
    projection is behind): not requested."""


class Sweeper:
    """Sweeps for the runs of one App's workflows that nobody resumes.

    Args:
        client: the Redis client holding the lease keys and the group's sweep turn.
        projection: the projection store (its marker, its ``RUNNING`` index, the runs' workflows).
        active: the writers' active set (and the runs' waits).
        routes: the version routes (runs parked for a version's member are not swept).
        workflows: the workflow names this App registers.
        lease_key: a run's lease key.
        request: appends a resume request for a run, with its reason (``lease expired``, ``wait timed
            out``).
        metrics: counts sweeps and the requests they made.
        turn_key: the group's sweep turn (``P:sweep:<group>``).
        member: this member's id (what it writes into the turn).
        interval_ms: how often the serving loop sweeps (the turn's length).
        on_log: the run's status on the log (its snapshot plus the log's tail), None when the log does
            not hold it: asked for a run only the projection's index lists, before it is requested.
    """

    def __init__(self, *, client: redis.Redis, projection: RedisStore, active: ActiveRuns,
                 routes: VersionRoutes, workflows: Callable[[], Iterable[str]],
                 lease_key: Callable[[str], str], request: Callable[[str, str], None],
                 metrics: ResumerMetrics, turn_key: str, member: str, interval_ms: int,
                 on_log: Callable[[str], RunStatus | None]) -> None:
        self.redis = client
        self.projection = projection
        self.active = active
        self.routes = routes
        self.workflows = workflows
        self.lease_key = lease_key
        self.request = request
        self.metrics = metrics
        self.turn_key = turn_key
        self.member = member
        self.interval_ms = interval_ms
        self.on_log = on_log
        self.ended: set[str] = set()
        """Runs the index listed ``RUNNING`` that the log has ended (read once, never requested)."""

    def sweep_turn(self, interval_ms: int) -> bool:
        """Whether this member sweeps now: one member of the group per interval (the first to take
        ``P:sweep:<group>`` for ``interval_ms``), not every member (which asked N resumes of each
        dead run). A member that dies holding the turn leaves it to expire: the next interval,
        another takes it."""
        return bool(self.redis.set(self.turn_key, self.member, nx=True, px=max(interval_ms - 50, 50)))

    def candidates(self) -> list[str]:
        """Runs of this App's workflows that may need a resume: the active set's, then the
        projection's ``RUNNING`` ones (runs from before the active set, or written by a writer
        that does not maintain it)."""
        return list(self._candidates())

    def _candidates(self) -> dict[str, bool]:
        """:meth:`candidates`, each with whether the writers' active set lists it (False: only the
        projection's index does, which may be behind the log)."""
        mine = set(self.workflows())
        found = {run_id: True for run_id, wf in self.active.list() if wf in mine}
        marker = self.projection.marker()
        if marker is None or marker.state != READY:
            # a rebuild, a swap or a replay is moving the indexes: they may list a run under an old
            # status; the active set (the writers' own) is swept, the indexes once ready again
            log.debug("sweep: the projection is %s; sweeping the active set only",
                      "missing" if marker is None else f"marked {marker.state!r}")
            return found
        running = self.projection.runs(RunStatus.RUNNING)
        if running:
            pipe = self.redis.pipeline(transaction=False)
            for run_id in running:
                pipe.hget(self.projection.state_key(run_id), "workflow")
            for run_id, wf in zip(running, pipe.execute(), strict=True):
                name = wf.decode() if isinstance(wf, bytes) else wf
                if name in mine and run_id not in self.ended:
                    found.setdefault(run_id, False)
        return found

    def sweep_if_turn(self) -> SweepReport | None:
        """:meth:`sweep` when this member holds the group's turn (the serving loop's sweep); None when
        another member swept this interval."""
        if not self.sweep_turn(self.interval_ms):
            return None
        return self.sweep()

    def sweep(self) -> SweepReport:
        """Request the resume of every run of this App's workflows that is active (or projected
        ``RUNNING``) and whose lease has expired; cancelled runs are skipped, and so are runs parked
        for a member serving their version (:mod:`runlog.processors.resume._versions`)."""
        self.metrics.sweeps.inc()
        report = SweepReport()
        candidates = self._candidates()
        cancelled = self.active.cancelled(list(candidates))  # the projection may not have folded it yet
        parked = self.routes.waiting_for(list(candidates))  # a member serving their version claims them
        for run_id, active in candidates.items():
            if run_id in cancelled or run_id in parked:
                continue
            if self.redis.exists(self.lease_key(run_id)):
                report.alive += 1
                continue
            if not active and not self.running_on_log(run_id):
                report.ended.append(run_id)
                continue
            self.request(run_id, "lease expired")
            self.metrics.sweep_requested.labels("lease_expired").inc()
            report.requested.append(run_id)
        for run_id in self.parents_to_wake():  # a child's request to wake its parent may have been lost
            if run_id in cancelled or self.redis.exists(self.lease_key(run_id)):
                continue
            self.request(run_id, "children ended")
            self.metrics.sweep_requested.labels("children_ended").inc()
            report.requested.append(run_id)
        mine = set(self.workflows())
        for run_id, workflow in self.active.due():  # waits whose deadline passed: their policy decides
            if workflow not in mine or not self.active.claim_due(run_id):  # another member took it
                continue
            self.request(run_id, "wait timed out")
            self.metrics.sweep_requested.labels("wait_timed_out").inc()
            report.requested.append(run_id)
        return report


    def parents_to_wake(self) -> list[str]:
        """Runs of this App waiting for child runs (``ctx.start_child``) all of which the projection shows
        ended: their wake-up (each child's end asks for it) may have been lost to a crash. Nothing while
        the projection is not whole; a child the projection is behind on is found at a later sweep."""
        marker = self.projection.marker()
        if marker is None or marker.state != READY:
            return []
        mine = set(self.workflows())
        parents = {}
        for run_id, st in self.projection.load_states(self.projection.runs(RunStatus.WAITING)).items():
            w, wf = st.waiting, st.workflow
            if st.status is RunStatus.WAITING and w is not None and w.signal == CHILD and w.children \
                    and wf is not None and wf.name in mine:
                parents[run_id] = w.children
        if not parents:
            return []
        kids = self.projection.load_states({c for cs in parents.values() for c in cs})
        return [run_id for run_id, cs in parents.items()
                if all(c in kids and kids[c].status in CHILD_ENDED for c in cs)]

    def running_on_log(self, run_id: str) -> bool:
        """Whether the log has the run ``RUNNING``, for a run only the projection's index lists: the
        index is as fresh as the projector that wrote it (none may be running), so it is not trusted
        with a resume request. A run the log has ended is remembered; one it does not hold is not
        requested (nothing to resume)."""
        status = self.on_log(run_id)
        if status is RunStatus.RUNNING:
            return True
        log.info("sweep: %s is listed RUNNING by the projection but is %s on the log: not requested",
                 run_id, "absent" if status is None else status.value)
        if status in ENDED:
            if len(self.ended) >= REMEMBERED_MAX:
                self.ended.clear()
            self.ended.add(run_id)
        return False
