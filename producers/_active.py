"""The writer-side registry of active runs: what the resumer's sweep looks at, no projector needed.

Two Redis keys (``P`` is the Redis prefix):

* ``P:runs:active`` sorted set: member = run id, score = time (ms since the epoch) of the
  last :meth:`ActiveRuns.add`;
* ``P:runs:active:workflow`` hash: run id -> the run's workflow name (so a resumer sweeps
  only the runs of the workflows its App registers).

A writer adds a run when it starts or resumes it (after ``RUN_STARTED`` /
``LEASE_ACQUIRED`` was acknowledged, while it holds the lease) and removes it when the run
completed, blocked or failed. A run whose writer died stays in the set without a lease
key: the resumer's sweep requests its resume, and a resumer that finds the run already
completed, blocked or failed removes it, so the set does not grow forever.

The set is a hint, never the truth (the log is): a run missing from it is still resumed
by an explicit request or found by the projection's ``RUNNING`` index, and a stale member
costs one resume that answers ``nothing_to_do``. The two writes are not one transaction
(the keys are global, like the projection's other indexes, and would sit in different
Redis Cluster slots); they are ordered so an interrupted add or remove leaves at worst a
workflow entry without a set member (ignored, overwritten by the next add) or a member
whose workflow reads as ``""`` (swept by no App, removed by the next add/remove).
"""

from __future__ import annotations

import time

import redis

__all__ = ["ActiveRuns"]


class ActiveRuns:
    """Runs a writer is (or was, until it died) executing, with their workflow names.

    Args:
        client: the Redis connection (a writer's or a resumer's).
        prefix: ``settings.redis_prefix``.
    """

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self._r = client
        self.prefix = prefix
        self.key = f"{prefix}:runs:active"
        self.workflow_key = f"{prefix}:runs:active:workflow"

    def add(self, run_id: str, workflow_name: str, *, at_ms: int | None = None) -> None:
        """Mark a run active (again): its score becomes ``at_ms`` (default: now)."""
        score = at_ms if at_ms is not None else int(time.time() * 1000)
        pipe = self._r.pipeline(transaction=False)
        pipe.hset(self.workflow_key, run_id, workflow_name)  # first: a member always has its workflow
        pipe.zadd(self.key, {run_id: score})
        pipe.execute()

    def remove(self, run_id: str) -> None:
        """Forget a run (it completed, blocked or failed); removing an absent run is a no-op."""
        pipe = self._r.pipeline(transaction=False)
        pipe.zrem(self.key, run_id)  # first: the member never outlives its workflow entry
        pipe.hdel(self.workflow_key, run_id)
        pipe.execute()

    def list(self) -> list[tuple[str, str]]:
        """``(run id, workflow name)`` of every active run, oldest ``add`` first (workflow ``""``
        when its entry is missing)."""
        members = [m.decode() if isinstance(m, bytes) else str(m)
                   for m in self._r.zrange(self.key, 0, -1)]
        if not members:
            return []
        names = self._r.hmget(self.workflow_key, members)
        return [(run_id, n.decode() if isinstance(n, bytes) else (n or ""))
                for run_id, n in zip(members, names, strict=True)]

    def __contains__(self, run_id: object) -> bool:
        return isinstance(run_id, str) and self._r.zscore(self.key, run_id) is not None
