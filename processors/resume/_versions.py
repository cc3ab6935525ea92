"""Version routing: which members serve which ``workflow@version``, and the runs waiting for one.

An App may register several versions of a workflow (a rolling deploy serves the old version's runs
while new runs start on the new one), and the members of one resumer group need not all register
the same versions: during a deploy, old members serve ``orders@1``, new ones ``orders@1`` and
``orders@2``. The group is named by the App's workflow *names* (:func:`runlog.processors.resume.app_id`),
so every member of a deploy shares one group and a request lands on whichever member owns its
partition. A member that does not serve the run's version never blocks it: it *parks* the run here
(outcome ``not_served``) and commits the request. Every member advertises the versions it serves
and, about once a second, claims the parked runs of those versions and resumes them; a run whose
version no live member serves stays parked, shown as waiting (``runlog runs``, ``show``,
``runlog versions``, the gauge ``runlog_resumer_runs_waiting_for_version``) until a member serving
it joins.

Redis keys (``P`` is the Redis prefix, ``L`` a label ``workflow@version``):

* ``P:versions:serving:L`` sorted set: member id -> last time (ms) it said it serves ``L``; a member
  is live while it said so within :data:`LIVE_MS`;
* ``P:versions:waiting:L`` sorted set: run id -> time (ms) it was parked;
* ``P:versions:parked`` hash: run id -> ``L`` (what a run waits for, for the views);
* ``P:versions:labels`` set: every ``L`` served or waited for (what the views list).

Claiming a parked run is a ``ZREM`` (one member wins it); the lease then makes its resume exclusive.
A member that dies after claiming leaves the run to the sweep (its lease is gone: the run is
requested again, and parked again if its new owner does not serve it either). A parked run that
another group or an operator resumed meanwhile costs one resume that answers ``nothing_to_do``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis

from runlog.processors.resume.resumer import NOT_ACTED
from runlog.projections import RunStatus

if TYPE_CHECKING:
    from runlog.processors.metrics import ResumerMetrics
    from runlog.processors.resume.resumer import ResumeOutcome
    from runlog.projections.redis_store import RedisStore

__all__ = ["ADVERTISE_S", "LIVE_MS", "PICKUP_S", "Advertiser", "VersionPickup", "VersionRoutes",
           "VersionView", "label"]

LIVE_MS = 15_000
"""A member is live for a version while it advertised it within this many milliseconds (members
advertise every :data:`ADVERTISE_S` from a thread of their own, so a long resume does not hide
them)."""

ADVERTISE_S = 2.0

PICKUP_S = 1.0
"""How often a member claims the parked runs of the versions it serves (and refreshes the gauges)."""

_WARN_EVERY_S = 60.0

log = logging.getLogger("runlog.resumer")


def label(workflow: str, version: str) -> str:
    """``workflow@version``."""
    return f"{workflow}@{version}"


def _ms() -> int:
    return int(time.time() * 1000)


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


@dataclass(frozen=True)
class VersionView:
    """One ``workflow@version`` as the routing keys tell it."""

    def describe(self) -> str:
        """``waits for a member serving orders@1 (none live)``, or with the live ones."""
        who = f"live: {', '.join(self.members)}" if self.members else "none live"
        return f"waits for a member serving {self.label} ({who})"

    label: str
    waiting: int
    """Runs parked for it (no member that served it had claimed them yet)."""
    oldest_waiting_ms: int | None
    members: tuple[str, ...]
    """Members live for it (advertised within :data:`LIVE_MS`)."""


class VersionRoutes:
    """The version routing keys (module docstring), on ``client`` under ``prefix``."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix

    def serving_key(self, lbl: str) -> str:
        return f"{self.prefix}:versions:serving:{lbl}"

    def waiting_key(self, lbl: str) -> str:
        return f"{self.prefix}:versions:waiting:{lbl}"

    @property
    def parked_key(self) -> str:
        return f"{self.prefix}:versions:parked"

    @property
    def labels_key(self) -> str:
        return f"{self.prefix}:versions:labels"

    # -- members ----------------------------------------------------------------------------------

    def advertise(self, member: str, labels: Iterable[str], now_ms: int | None = None) -> None:
        """Say ``member`` serves ``labels`` now."""
        now = _ms() if now_ms is None else now_ms
        labels = list(labels)
        pipe = self.client.pipeline(transaction=False)
        for lbl in labels:
            pipe.zadd(self.serving_key(lbl), {member: now})
            # members silent for long are dropped, so the set does not grow with every restart
            pipe.zremrangebyscore(self.serving_key(lbl), 0, now - 100 * LIVE_MS)
        if labels:
            pipe.sadd(self.labels_key, *labels)
        pipe.execute()

    def withdraw(self, member: str, labels: Iterable[str]) -> None:
        """``member`` stops serving ``labels`` (it is closing)."""
        pipe = self.client.pipeline(transaction=False)
        for lbl in labels:
            pipe.zrem(self.serving_key(lbl), member)
        pipe.execute()

    def live(self, lbl: str, now_ms: int | None = None) -> tuple[str, ...]:
        """The members live for ``lbl``."""
        now = _ms() if now_ms is None else now_ms
        return tuple(sorted(_text(m) for m in
                            self.client.zrangebyscore(self.serving_key(lbl), now - LIVE_MS, "+inf")))

    # -- runs -------------------------------------------------------------------------------------

    def park(self, run_id: str, lbl: str, now_ms: int | None = None) -> None:
        """``run_id`` waits for a member serving ``lbl`` (kept at its first parking time)."""
        now = _ms() if now_ms is None else now_ms
        pipe = self.client.pipeline(transaction=False)
        pipe.hset(self.parked_key, run_id, lbl)
        pipe.zadd(self.waiting_key(lbl), {run_id: now}, nx=True)
        pipe.sadd(self.labels_key, lbl)
        pipe.execute()

    def parked(self, lbl: str, limit: int = 100) -> list[str]:
        """Up to ``limit`` runs waiting for ``lbl``, longest waiting first."""
        return [_text(r) for r in self.client.zrange(self.waiting_key(lbl), 0, limit - 1)]

    def claim(self, run_id: str, lbl: str) -> bool:
        """Take ``run_id`` off ``lbl``'s waiting set; True for the one member that did."""
        if not self.client.zrem(self.waiting_key(lbl), run_id):
            return False
        self.client.hdel(self.parked_key, run_id)
        return True

    def settle(self, run_ids: Iterable[str]) -> None:
        """Forget ``run_ids`` (resumed, complete, cancelled): they wait for nothing."""
        ids = list(run_ids)
        if not ids:
            return
        found = self.client.hmget(self.parked_key, ids)
        pipe = self.client.pipeline(transaction=False)
        for run_id, lbl in zip(ids, found, strict=True):
            if lbl is not None:
                pipe.zrem(self.waiting_key(_text(lbl)), run_id)
                pipe.hdel(self.parked_key, run_id)
        pipe.execute()

    def waiting_for(self, run_ids: Sequence[str]) -> dict[str, str]:
        """``run_id -> label`` for the runs of ``run_ids`` that wait for a version's member."""
        if not run_ids:
            return {}
        found = self.client.hmget(self.parked_key, list(run_ids))
        return {r: _text(lbl) for r, lbl in zip(run_ids, found, strict=True) if lbl is not None}

    def waits(self, run_ids: Sequence[str]) -> dict[str, VersionView]:
        """``run_id -> its label's view`` for the runs of ``run_ids`` that wait for a version's member."""
        found = self.waiting_for(run_ids)
        views = {view.label: view for view in self.views(set(found.values()))} if found else {}
        return {run_id: views[lbl] for run_id, lbl in found.items()}

    # -- views ------------------------------------------------------------------------------------

    def labels(self) -> list[str]:
        return sorted(_text(v) for v in self.client.smembers(self.labels_key))

    def views(self, labels: Iterable[str] | None = None, now_ms: int | None = None) -> list[VersionView]:
        """Every label's waiting runs and live members."""
        now = _ms() if now_ms is None else now_ms
        lbls = self.labels() if labels is None else sorted(set(labels))
        pipe = self.client.pipeline(transaction=False)
        for lbl in lbls:
            pipe.zcard(self.waiting_key(lbl))
            pipe.zrange(self.waiting_key(lbl), 0, 0, withscores=True)
            pipe.zrangebyscore(self.serving_key(lbl), now - LIVE_MS, "+inf")
        res = pipe.execute()
        out = []
        for i, lbl in enumerate(lbls):
            n, first, members = res[3 * i], res[3 * i + 1], res[3 * i + 2]
            out.append(VersionView(lbl, int(n), int(first[0][1]) if first else None,
                                   tuple(sorted(_text(m) for m in members))))
        return out


class Advertiser:
    """Advertises a member's labels every :data:`ADVERTISE_S` from a daemon thread until closed."""

    def __init__(self, routes: VersionRoutes, member: str, labels: Sequence[str]) -> None:
        self.routes, self.member, self.labels = routes, member, tuple(labels)
        self._stop = threading.Event()
        self.last_error: Exception | None = None
        self._thread = threading.Thread(target=self._loop, name=f"runlog-advertise-{member}", daemon=True)

    def start(self) -> Advertiser:
        self._tick()
        self._thread.start()
        return self

    def _tick(self) -> None:
        try:
            self.routes.advertise(self.member, self.labels)
            self.last_error = None
        except redis.RedisError as err:  # a failover: the next tick says it again
            self.last_error = err

    def _loop(self) -> None:
        while not self._stop.wait(ADVERTISE_S):
            self._tick()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(redis.RedisError):  # else the member ages out after LIVE_MS
            self.routes.withdraw(self.member, self.labels)


class VersionPickup:
    """A member's part of version routing: park the runs it does not serve, pick up the parked runs
    of the versions it serves (the part of :class:`~runlog.processors.resume.service.ResumerService`
    that does it).

    Args:
        routes: the version routing keys.
        serves: the ``workflow@version`` labels this member serves.
        projection: the projection store (whether a parked run finished meanwhile).
        resume: resumes a run (no request, no seen epoch); its outcome, or None when it was not resumed.
        finished: whether the log says a run is complete or cancelled.
        metrics: the version gauges.
    """

    def __init__(self, routes: VersionRoutes, serves: Sequence[str], *, projection: RedisStore,
                 resume: Callable[[str], ResumeOutcome | None], finished: Callable[[str], bool],
                 metrics: ResumerMetrics) -> None:
        self.routes = routes
        self.serves = tuple(serves)
        self.projection = projection
        self.resume = resume
        self.finished = finished
        self.metrics = metrics
        self._warned: dict[str, float] = {}  # label -> when its last "no member serves" warning went out

    def park(self, run_id: str, lbl: str) -> None:
        """Park ``run_id`` for a member serving ``lbl`` (a resume answered ``not_served``), unless it
        finished meanwhile."""
        self.routes.park(run_id, lbl)
        # the request was read before another member (serving ``lbl``) may have finished the run and
        # settled its parking: read the log again after parking, so a finished run is never left
        # parked (the finisher's settle came after this park, or its last event is read here)
        if self.finished(run_id):
            self.routes.settle([run_id])
            log.info("resume %s: finished meanwhile, not parked", run_id)
            return
        live = self.routes.live(lbl)
        log.info("resume %s: parked for a member serving %s (%s)", run_id, lbl,
                 f"live: {', '.join(live)}" if live else "none live")
        if not live:
            self._warn_unserved(lbl)

    def _warn_unserved(self, lbl: str) -> None:
        now = time.monotonic()
        if now - self._warned.get(lbl, -_WARN_EVERY_S) >= _WARN_EVERY_S:
            self._warned[lbl] = now
            log.warning("no member serves %s: its runs wait until one joins (runlog versions)", lbl)

    def _forget_finished(self, labels: Iterable[str], limit: int) -> None:
        """Unpark the runs waiting for versions this member does not serve that are complete or
        cancelled meanwhile: a member may park a run from a request it read just before another
        member finished it, and no member serving that version may be left to claim it (a drained
        version would never show drained)."""
        parked = {r: lbl for lbl in labels if lbl not in self.serves
                  for r in self.routes.parked(lbl, limit)}
        if not parked:
            return
        states = self.projection.load_states(parked)
        done = [r for r, st in states.items() if st.status in (RunStatus.COMPLETED, RunStatus.CANCELLED)]
        if done:
            log.info("unparked %d finished run(s): %s", len(done), ", ".join(sorted(done)[:5]))
            self.routes.settle(done)

    def pick_up_parked(self, limit: int = 100) -> list[ResumeOutcome]:
        """Claim and resume the runs parked for the versions this member serves (up to ``limit``
        per version), and refresh the version gauges; their outcomes."""
        out: list[ResumeOutcome] = []
        for lbl in self.serves:
            for run_id in self.routes.parked(lbl, limit):
                if not self.routes.claim(run_id, lbl):
                    continue  # another member claimed it first
                log.info("resume %s: claimed, it waited for %s", run_id, lbl)
                outcome = self.resume(run_id)
                if outcome is not None and outcome.result not in NOT_ACTED:
                    out.append(outcome)
        labels = self.routes.labels()
        self._forget_finished(labels, limit)
        for view in self.routes.views(labels):
            wf, _, version = view.label.rpartition("@")
            self.metrics.waiting_for_version.labels(wf, version).set(view.waiting)
            self.metrics.version_members.labels(wf, version).set(len(view.members))
            if view.waiting and not view.members:
                self._warn_unserved(view.label)
        return out
