"""Lease verifies of many runs on one event loop, coalesced: one round trip for all of them.

An :class:`~runlog.producers.log._lease.AsyncRedisLeaseManager`'s leases verify themselves before every
call (a beat: the lease key extended if it still holds the writer's token). Hundreds of runs on
one loop each made that round trip alone; :class:`CoalescedBeats` gathers the beats asked for on
a loop until the loop runs the task that sends them, then sends them as one pipeline (on a Redis
Cluster, one per node) and answers each beat for its own lease. A verify still waits for a reply
from Redis made after it asked, so the fencing is the same: a lease taken over is seen by the
next verify.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

__all__ = ["CoalescedBeats"]

L = TypeVar("L")

Send = Callable[[list[L]], Awaitable[list[bool] | None]]
"""One round trip beating every lease given: each one's answer, or None when Redis did not answer
(:meth:`runlog.producers.log._lease.RedisLeaseManager.beats`)."""


class CoalescedBeats(Generic[L]):
    """Beats of leases asked for on one loop, sent together by ``send`` (see the module docstring)."""

    def __init__(self, send: Send[L]) -> None:
        self._send_beats = send
        self._waiting: dict[asyncio.AbstractEventLoop, list[tuple[L, asyncio.Future[bool]]]] = {}
        self._sending: set[asyncio.Task[None]] = set()

    async def beat(self, lease: L) -> bool:
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
        try:
            oks = await self._send_beats([lease for lease, _ in group])
        except BaseException as err:  # every beat waiting on this round trip hears of it
            for _, fut in group:
                if not fut.done():
                    fut.set_exception(err)
            raise
        for i, (_, fut) in enumerate(group):
            if not fut.done():
                fut.set_result(True if oks is None else oks[i])  # None: unknown, as a lone beat
