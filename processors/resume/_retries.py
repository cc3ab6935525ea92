"""Contended runs, retried once the lease can have expired: a request answered ``contended`` (another
writer's lease is still alive) is retried in memory at now + the lease key's remaining PTTL +
:data:`RETRY_MARGIN_S`, at most :data:`CONTENDED_RETRIES` times per run, keeping the epoch its requests
saw; then the sweep is the backstop. :class:`ContendedRetries` is the scheduler a
:class:`~runlog.processors.resume.service.ResumerService` holds; it knows of the service only the
resume it is given."""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import redis

from runlog.processors.metrics import ResumerMetrics
from runlog.processors.resume.resumer import NOT_ACTED, ResumeOutcome

__all__ = ["CONTENDED_RETRIES", "RETRY_MARGIN_S", "ContendedRetries", "LeaseKeys"]

log = logging.getLogger("runlog.resumer")

CONTENDED_RETRIES = 5
"""How many times one run answered ``contended`` is retried before the resumer gives up."""

RETRY_MARGIN_S = 0.25
"""Added to the lease's remaining lifetime before a contended run is retried."""


class LeaseKeys(Protocol):
    """What the scheduler reads of a run's lease key: its remaining lifetime and whether it exists."""

    def pttl(self, name: str) -> Any: ...

    def exists(self, *names: str) -> Any: ...


class ContendedRetries:
    """The contended runs waiting for their retry, as a heap by due time.

    Args:
        leases: where the lease keys live (the service's Redis client).
        lease_key: a run's lease key.
        lease_ttl_ms: the lease's lifetime, waited for when a key's remaining lifetime is unknown.
        resume: resumes a run with the epoch its requests saw; its outcome, or None when the run was
            not resumed (refused by ``accept``, failed, unknown).
        metrics: counts the retries run and the runs given up.
    """

    def __init__(self, leases: LeaseKeys, lease_key: Callable[[str], str], lease_ttl_ms: int, *,
                 resume: Callable[[str, int | None], ResumeOutcome | None], metrics: ResumerMetrics) -> None:
        self.leases = leases
        self.lease_key = lease_key
        self.lease_ttl_ms = lease_ttl_ms
        self.resume = resume
        self.metrics = metrics
        self._due: list[tuple[float, int, str]] = []  # (due, tie breaker, run id), a heap
        self._scheduled: set[str] = set()
        self._attempts: dict[str, int] = {}
        self._seen: dict[str, int | None] = {}  # run id -> the epoch its pending retry's requests saw
        self._tie = itertools.count()

    @property
    def pending(self) -> bool:
        """Whether a retry is scheduled."""
        return bool(self._due)

    @property
    def attempts(self) -> Mapping[str, int]:
        """Run id -> the retries asked for it so far (runs that are no longer contended are gone)."""
        return self._attempts

    @property
    def seen(self) -> Mapping[str, int | None]:
        """Run id -> the epoch its pending retry's requests saw."""
        return self._seen

    def _remaining_lease_s(self, run_id: str) -> float:
        try:
            ms = int(self.leases.pttl(self.lease_key(run_id)))
        except redis.RedisError:
            ms = -1
        if ms == -2:  # no lease key any more: retry at once (after the margin)
            return 0.0
        if ms < 0:  # no expiry, or unknown: a whole lease ttl
            return self.lease_ttl_ms / 1000.0
        return ms / 1000.0

    def schedule(self, run_id: str, seen_epoch: int | None) -> None:
        """Retry ``run_id`` once its lease can have expired, unless it was retried
        :data:`CONTENDED_RETRIES` times already (then it is given up: the sweep is the backstop)."""
        # the retry carries the epoch its requests saw (the least strict of them: None wins)
        if run_id in self._seen:
            before = self._seen[run_id]
            seen_epoch = None if before is None or seen_epoch is None else max(before, seen_epoch)
        self._seen[run_id] = seen_epoch
        n = self._attempts.get(run_id, 0) + 1
        if n > CONTENDED_RETRIES:
            self.forget(run_id)
            self.metrics.retries_abandoned.inc()
            log.warning("resume %s: still contended after %d retries; giving up (the sweep requests it "
                        "again once its lease is gone)", run_id, CONTENDED_RETRIES)
            return
        self._attempts[run_id] = n
        if run_id in self._scheduled:
            return
        delay = self._remaining_lease_s(run_id) + RETRY_MARGIN_S
        heapq.heappush(self._due, (time.monotonic() + delay, next(self._tie), run_id))
        self._scheduled.add(run_id)
        log.info("resume %s: contended, retry %d of %d in %.2fs", run_id, n, CONTENDED_RETRIES, delay)

    def forget(self, run_id: str) -> None:
        """``run_id`` is no longer contended: its count of attempts and its seen epoch go (a retry
        already scheduled still runs)."""
        self._attempts.pop(run_id, None)
        self._seen.pop(run_id, None)

    def next_in(self) -> float | None:
        """Seconds until the next scheduled retry is due (0 when overdue); None when none is."""
        if not self._due:
            return None
        return max(0.0, self._due[0][0] - time.monotonic())

    def run_due(self) -> list[ResumeOutcome]:
        """Resume every contended run whose retry is due; their outcomes (not ``not_mine``)."""
        out: list[ResumeOutcome] = []
        now = time.monotonic()
        due: list[str] = []
        while self._due and self._due[0][0] <= now:  # taken first: a rescheduled run waits
            due.append(heapq.heappop(self._due)[2])
        for run_id in due:
            self._scheduled.discard(run_id)
            try:
                alive = bool(self.leases.exists(self.lease_key(run_id)))
            except redis.RedisError:
                alive = False  # let resume find out
            seen_epoch = self._seen.get(run_id)
            if alive:  # still leased: wait again without planning (counts as an attempt)
                log.debug("retry of %s: its lease is still held", run_id)
                self.schedule(run_id, seen_epoch)
                continue
            self.metrics.retries.inc()
            outcome = self.resume(run_id, seen_epoch)
            if outcome is not None and outcome.result not in NOT_ACTED:
                out.append(outcome)
        return out
