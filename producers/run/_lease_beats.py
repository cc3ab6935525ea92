"""Lease verifies of many runs on one event loop, coalesced: one round trip for all of them.

An :class:`~producers.run._lease.AsyncRedisLeaseManager`'s leases verify themselves before every
call (a beat: the lease key extended if it still holds the writer's token). Hundreds of runs on
one loop each made that round trip alone; :class:`CoalescedBeats` gathers the beats asked for on
a loop until the loop runs the task that sends them, then sends them as one pipeline (on a Redis
Cluster, one per node) and answers each beat for its own lease. A verify still waits for a reply
from Redis made after it asked, so the fencing is the same: a lease taken over is seen by the
next verify.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

import redis

from producers.run._redis_io import Lua, pipelined

__all__ = ["CoalescedBeats"]


class RedisLease(Protocol):
    """What a beat needs of a lease (:class:`producers.run._lease.RedisLease`)."""

    key: str
    token: str

    def observe(self, ok: bool, at: float) -> None: ...


class CoalescedBeats:
    """Beats of leases asked for on one loop, sent together (see the module docstring)."""

    def __init__(self, aclient: Any, extend: Lua, ttl_ms: int) -> None:
        self._aclient = aclient
        self._extend = extend
        self._ttl_ms = ttl_ms
        self._waiting: dict[asyncio.AbstractEventLoop, list[tuple[RedisLease, asyncio.Future[bool]]]] = {}
        self._sending: set[asyncio.Task[None]] = set()

    async def beat(self, lease: RedisLease) -> bool:
        """Extend ``lease`` in the next round trip of this loop's beats: True extended (or
        unknown: Redis did not answer, and the lease's ``check()`` expires it locally in time),
        False taken over or expired (the lease is then lost)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        group = self._waiting.get(loop)
        if group is None:
            group = self._waiting[loop] = []
            task = loop.create_task(self._send(loop))  # runs once this pass's callers have asked
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)
        group.append((lease, fut))
        return await fut

    async def _send(self, loop: asyncio.AbstractEventLoop) -> None:
        group = self._waiting.pop(loop, [])
        if not group:
            return
        at = time.monotonic()  # before the round trip: each extension counts from no later than this

        def fill(pipe: Any) -> None:
            for lease, _ in group:
                self._extend.queue(pipe, [lease.key], [lease.token, self._ttl_ms])

        try:
            results: list[Any] | None = await pipelined(fill)(self._aclient)
        except redis.RedisError:
            results = None
        except BaseException as err:  # every beat waiting on this round trip hears of it
            for _, fut in group:
                if not fut.done():
                    fut.set_exception(err)
            raise
        for i, (lease, fut) in enumerate(group):
            if results is None:
                ok = True  # unknown: check() turns the lease lost if Redis stays away
            else:
                ok = int(results[i]) == 1
                lease.observe(ok, at)
            if not fut.done():
                fut.set_result(ok)
