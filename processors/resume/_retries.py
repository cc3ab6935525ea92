"""Contended runs, retried once the lease can have expired (a mixin of
:class:`~runlog.processors.resume.service.ResumerService`): a request answered ``contended`` (another writer's
lease is still alive) is retried in memory at now + the lease key's remaining PTTL +
:data:`RETRY_MARGIN_S`, at most :data:`CONTENDED_RETRIES` times per run, keeping the epoch its requests
saw; then the sweep is the backstop."""

from __future__ import annotations

import heapq
import itertools
import logging
import time

import redis

from runlog.processors.metrics import ResumerMetrics
from runlog.processors.resume.resumer import NOT_ACTED, ResumeOutcome
from runlog.schemas import Settings

__all__ = ["CONTENDED_RETRIES", "RETRY_MARGIN_S", "ContendedRetries"]

log = logging.getLogger("runlog.resumer")

CONTENDED_RETRIES = 5
"""How many times one run answered ``contended`` is retried before the resumer gives up."""

RETRY_MARGIN_S = 0.25
"""Added to the lease's remaining lifetime before a contended run is retried."""


class ContendedRetries:
    """The retries' part of the resumer service."""

    settings: Settings
    redis: redis.Redis
    metrics: ResumerMetrics
    _retries: list[tuple[float, int, str]]
    _scheduled: set[str]
    _attempts: dict[str, int]
    _seen: dict[str, int | None]
    _tie: itertools.count[int]

    def lease_key(self, run_id: str) -> str:
        raise NotImplementedError

    def _resume(self, run_id: str, msg: object, seen_epoch: int | None) -> ResumeOutcome | None:
        raise NotImplementedError

    def _remaining_lease_s(self, run_id: str) -> float:
        try:
            ms = int(self.redis.pttl(self.lease_key(run_id)))
        except redis.RedisError:
            ms = -1
        if ms == -2:  # no lease key any more: retry at once (after the margin)
            return 0.0
        if ms < 0:  # no expiry, or unknown: a whole lease ttl
            return self.settings.lease_ttl_ms / 1000.0
        return ms / 1000.0

    def _schedule_retry(self, run_id: str, seen_epoch: int | None) -> None:
        # the retry carries the epoch its requests saw (the least strict of them: None wins)
        if run_id in self._seen:
            before = self._seen[run_id]
            seen_epoch = None if before is None or seen_epoch is None else max(before, seen_epoch)
        self._seen[run_id] = seen_epoch
        n = self._attempts.get(run_id, 0) + 1
        if n > CONTENDED_RETRIES:
            self._attempts.pop(run_id, None)
            self._seen.pop(run_id, None)
            self.metrics.retries_abandoned.inc()
            log.warning("resume %s: still contended after %d retries; giving up (the sweep requests it "
                        "again once its lease is gone)", run_id, CONTENDED_RETRIES)
            return
        self._attempts[run_id] = n
        if run_id in self._scheduled:
            return
        delay = self._remaining_lease_s(run_id) + RETRY_MARGIN_S
        heapq.heappush(self._retries, (time.monotonic() + delay, next(self._tie), run_id))
        self._scheduled.add(run_id)
        log.info("resume %s: contended, retry %d of %d in %.2fs", run_id, n, CONTENDED_RETRIES, delay)

    def next_retry_in(self) -> float | None:
        """Seconds until the next scheduled retry is due (0 when overdue); None when none is."""
        if not self._retries:
            return None
        return max(0.0, self._retries[0][0] - time.monotonic())

    def run_due_retries(self) -> list[ResumeOutcome]:
        """Resume every contended run whose retry is due; their outcomes (not ``not_mine``)."""
        out: list[ResumeOutcome] = []
        now = time.monotonic()
        due: list[str] = []
        while self._retries and self._retries[0][0] <= now:  # taken first: a rescheduled run waits
            due.append(heapq.heappop(self._retries)[2])
        for run_id in due:
            self._scheduled.discard(run_id)
            try:
                alive = bool(self.redis.exists(self.lease_key(run_id)))
            except redis.RedisError:
                alive = False  # let resume find out
            seen_epoch = self._seen.get(run_id)
            if alive:  # still leased: wait again without planning (counts as an attempt)
                log.debug("retry of %s: its lease is still held", run_id)
                self._schedule_retry(run_id, seen_epoch)
                continue
            self.metrics.retries.inc()
            outcome = self._resume(run_id, None, seen_epoch)
            if outcome is not None and outcome.result not in NOT_ACTED:
                out.append(outcome)
        return out

