"""The writer-side registry of active runs: what the resumer's sweep looks at, no projector needed.

Two Redis keys (``P`` is the Redis prefix):

* ``P:runs:active`` sorted set: member = run id, score = time (ms since the epoch) of the
  last :meth:`ActiveRuns.add`;
* ``P:runs:active:workflow`` hash: run id -> the run's workflow name (so a resumer sweeps
  only the runs of the workflows its App registers);
* ``P:runs:waiting`` sorted set: runs waiting for a signal with a deadline, score = the
  deadline (ms); the sweep resumes them when it passes (their workflow name stays in the
  hash). A waiting run is not in ``P:runs:active``: nothing should resume it before its
  signal or its deadline.

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

``aadd`` / ``aremove`` / ``await_`` (the async ``wait``) are the writer's calls for an event
loop: with an asyncio client they await the same pipelines on it, without one they are the
sync calls.

A cancelled run (``runlog cancel``) is removed from both sets and marked
``P:{<run_id>}:cancelled``, so a sweep that still finds it (in the projection's ``RUNNING``
index before the projector folded ``RUN_CANCELLED``) skips it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import redis
import redis.asyncio

from runlog.producers.base._redis_io import RoundTrip, arun, one, pipelined, run

__all__ = ["ActiveRuns"]


class ActiveRuns:
    """Runs a writer is (or was, until it died) executing, with their workflow names.

    Args:
        client: the Redis connection (a writer's or a resumer's).
        prefix: ``settings.redis_prefix``.
    """

    def __init__(self, client: redis.Redis, prefix: str, *,
                 aclient: redis.asyncio.Redis | None = None) -> None:
        self._r = client
        self._ar = aclient
        self.prefix = prefix
        self.key = f"{prefix}:runs:active"
        self.workflow_key = f"{prefix}:runs:active:workflow"
        self.waiting_key = f"{prefix}:runs:waiting"

    # -- the writer's updates, once (see runlog.producers.base._redis_io): one pipeline each

    def _added(self, run_id: str, workflow_name: str, at_ms: int | None) -> RoundTrip:
        score = at_ms if at_ms is not None else int(time.time() * 1000)

        def fill(pipe: Any) -> None:
            pipe.hset(self.workflow_key, run_id, workflow_name)  # first: a member always has its workflow
            pipe.zadd(self.key, {run_id: score})

        return pipelined(fill)

    def _removed(self, run_id: str) -> RoundTrip:
        def fill(pipe: Any) -> None:
            pipe.zrem(self.key, run_id)  # first: the member never outlives its workflow entry
            pipe.zrem(self.waiting_key, run_id)
            pipe.hdel(self.workflow_key, run_id)

        return pipelined(fill)

    def _waiting(self, run_id: str, workflow_name: str, deadline_ms: int) -> RoundTrip:
        def fill(pipe: Any) -> None:
            pipe.zrem(self.key, run_id)
            if deadline_ms > 0:
                pipe.hset(self.workflow_key, run_id, workflow_name)
                pipe.zadd(self.waiting_key, {run_id: deadline_ms})
            else:
                pipe.hdel(self.workflow_key, run_id)

        return pipelined(fill)

    def add(self, run_id: str, workflow_name: str, *, at_ms: int | None = None) -> None:
        """Mark a run active (again): its score becomes ``at_ms`` (default: now)."""
        run(one(self._added(run_id, workflow_name, at_ms)), self._r)

    async def aadd(self, run_id: str, workflow_name: str, *, at_ms: int | None = None) -> None:
        """:meth:`add` for an event loop."""
        await arun(one(self._added(run_id, workflow_name, at_ms)), self._ar, self._r)

    def remove(self, run_id: str) -> None:
        """Forget a run (it completed, blocked or failed); removing an absent run is a no-op."""
        run(one(self._removed(run_id)), self._r)

    async def aremove(self, run_id: str) -> None:
        """:meth:`remove` for an event loop."""
        await arun(one(self._removed(run_id)), self._ar, self._r)

    def wait(self, run_id: str, workflow_name: str, deadline_ms: int) -> None:
        """The run waits for a signal: out of the active set; in the waiting set when it has a deadline."""
        run(one(self._waiting(run_id, workflow_name, deadline_ms)), self._r)

    async def await_(self, run_id: str, workflow_name: str, deadline_ms: int) -> None:
        """:meth:`wait` for an event loop."""
        await arun(one(self._waiting(run_id, workflow_name, deadline_ms)), self._ar, self._r)

    def _with_workflows(self, raw: Any) -> list[tuple[str, str]]:
        members = [m.decode() if isinstance(m, bytes) else str(m) for m in raw]
        if not members:
            return []
        names = self._r.hmget(self.workflow_key, members)
        return [(run_id, n.decode() if isinstance(n, bytes) else (n or ""))
                for run_id, n in zip(members, names, strict=True)]

    def due(self, now_ms: int | None = None) -> list[tuple[str, str]]:
        """``(run id, workflow name)`` of waiting runs whose deadline passed, earliest first."""
        at = now_ms if now_ms is not None else int(time.time() * 1000)
        return self._with_workflows(self._r.zrangebyscore(self.waiting_key, 0, at))

    def claim_due(self, run_id: str) -> bool:
        """Take a due wait out of the waiting set; True for the one caller that removed it (of any
        number of resumer members looking at the same due run), so one resume request is made."""
        return bool(self._r.zrem(self.waiting_key, run_id))

    def arm(self, run_id: str, workflow_name: str, deadline_ms: int) -> bool:
        """Put a waiting run into the waiting set unless it is there (re-arming from the projection,
        which the log rebuilds); True when it was missing."""
        pipe = self._r.pipeline(transaction=False)
        pipe.hset(self.workflow_key, run_id, workflow_name)
        pipe.zadd(self.waiting_key, {run_id: deadline_ms}, nx=True)
        return bool(pipe.execute()[1])

    def unwait(self, run_id: str) -> None:
        """The run's wait is over (its signal arrived, or its deadline was handled)."""
        self._r.zrem(self.waiting_key, run_id)

    def list(self) -> list[tuple[str, str]]:
        """``(run id, workflow name)`` of every active run, oldest ``add`` first (workflow ``""``
        when its entry is missing)."""
        return self._with_workflows(self._r.zrange(self.key, 0, -1))

    def __contains__(self, run_id: object) -> bool:
        return isinstance(run_id, str) and self._r.zscore(self.key, run_id) is not None

    # -- cancelled runs (``runlog cancel``): never swept again ----------------------------------

    def cancelled_key(self, run_id: str) -> str:
        return f"{self.prefix}:{{{run_id}}}:cancelled"

    def cancel(self, run_id: str) -> None:
        """The run was cancelled: mark it (``P:{run}:cancelled``) and forget it as active or waiting."""
        self._r.set(self.cancelled_key(run_id), "1")
        self.remove(run_id)

    def cancelled(self, run_ids: Iterable[str]) -> set[str]:
        """Which of ``run_ids`` were cancelled (one round trip)."""
        ids = tuple(run_ids)
        if not ids:
            return set()
        pipe = self._r.pipeline(transaction=False)
        for run_id in ids:
            pipe.exists(self.cancelled_key(run_id))
        return {run_id for run_id, n in zip(ids, pipe.execute(), strict=True) if n}
