"""Pipelines of many runs on one event loop, coalesced: one round trip for the writes of a loop pass.

The AsyncRunner runs hundreds of runs on one loop; each one's small Redis writes (marking the run
active, then inactive; releasing its lease) were a round trip each, and a round trip costs the loop
far more in redis-py's connection handling than the commands themselves. :func:`coalesced` is a
step (:mod:`producers.run._redis_io`) like :func:`~producers.run._redis_io.pipelined`: on an
asyncio client, the fills asked for on a loop until the loop runs the task that sends them go in
one pipeline (on a Redis Cluster, one per node), and each caller gets the answers of its own
commands, or the error of one of them; on a sync client it is :func:`pipelined` itself. Nothing
is reordered within a caller's fill, and a caller's commands are sent after it asked, so what it
reads or writes is as fresh as with a round trip of its own.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Any

import redis.asyncio
import redis.asyncio.cluster

from producers.run._redis_io import Step, pipelined

__all__ = ["coalesced"]

Fill = Callable[[Any], object]


def coalesced(fill: Fill) -> Step:
    """One round trip of ``fill``'s commands, shared with the other coalesced fills of this loop
    pass on an asyncio client (see the module docstring); :func:`pipelined` on a sync client."""
    plain = pipelined(fill)

    def step(c: Any) -> Any:
        if not isinstance(c, redis.asyncio.Redis | redis.asyncio.RedisCluster):
            return plain(c)
        return _coalescer(c).submit(fill)

    return step


_by_client: weakref.WeakKeyDictionary[Any, _Coalescer] = weakref.WeakKeyDictionary()


def _coalescer(client: Any) -> _Coalescer:
    c = _by_client.get(client)
    if c is None:
        c = _by_client[client] = _Coalescer(client)
    return c


class _Coalescer:
    def __init__(self, client: Any) -> None:
        self._client = client
        self._waiting: dict[asyncio.AbstractEventLoop, list[tuple[Fill, asyncio.Future[list[Any]]]]] = {}
        self._sending: set[asyncio.Task[None]] = set()

    async def submit(self, fill: Fill) -> list[Any]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[Any]] = loop.create_future()
        group = self._waiting.get(loop)
        if group is None:
            group = self._waiting[loop] = []
            task = loop.create_task(self._send(loop))  # runs once this pass's callers have asked
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)
        group.append((fill, fut))
        return await fut

    async def _send(self, loop: asyncio.AbstractEventLoop) -> None:
        group = self._waiting.pop(loop, [])
        if not group:
            return
        spans: list[tuple[int, int]] = []

        def fill_all(pipe: Any) -> None:
            spans.clear()  # a failover retry fills the pipeline again
            for fill, _ in group:
                start = len(pipe)
                fill(pipe)
                spans.append((start, len(pipe)))

        async def once() -> list[Any]:
            pipe = self._client.pipeline(transaction=False)
            fill_all(pipe)
            answers: list[Any] = await pipe.execute(raise_on_error=False)
            return answers

        try:
            window = getattr(self._client, "failover_s", 0.0)
            if window:
                from schemas._redis import aretry_failover

                answers = await aretry_failover(window, once)
            else:
                answers = await once()
        except BaseException as err:  # every caller of this round trip hears of it
            for _, fut in group:
                if not fut.done():
                    fut.set_exception(err)
            if not isinstance(err, Exception):
                raise
            return
        for (start, end), (_, fut) in zip(spans, group, strict=True):
            mine = answers[start:end]
            failed = next((a for a in mine if isinstance(a, Exception)), None)
            if fut.done():
                continue
            if failed is not None:
                fut.set_exception(failed)
            else:
                fut.set_result(mine)
