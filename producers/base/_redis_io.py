"""The SDK's Redis round trips as protocol steps, run on a sync client or awaited on an asyncio one.

A port's protocol (which keys, which scripts, how the answers read) is written once, as a
generator of steps of the one protocol (:mod:`runlog.producers.base._protocol`). A :class:`RoundTrip`
holds a function of a client that makes one round trip: given a ``redis.Redis`` it returns the answer,
given a ``redis.asyncio.Redis`` an awaitable of it (redis-py's two clients share their command
methods, so ``RoundTrip(lambda c: c.get(key))`` is both). :func:`run` drives the steps with the sync
client (:class:`OnClient`), :func:`arun` awaits them with the asyncio one (:class:`OnAsyncClient`).
An error of a step is thrown back into the generator at its ``yield from``, so the protocol handles
errors once too::

    def _read(self, key: str) -> Steps[str | None]:
        raw = yield from RoundTrip(lambda c: c.get(key))
        return None if raw is None else raw.decode()

    def read(self, key: str) -> str | None:
        return run(self._read(key), self._r)

    async def aread(self, key: str) -> str | None:
        return await arun(self._read(key), self._ar, self._r)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import redis
import redis.asyncio
import redis.asyncio.cluster

from runlog.producers.base._protocol import SYNC, LoopMode, Mode, Step, Steps, adrive, drive
from runlog.schemas.internal import AsyncFailoverCluster, aretry_failover, retry_failover

__all__ = ["Lua", "OnAsyncClient", "OnClient", "RoundTrip", "Steps", "arun", "offloaded", "one", "pipelined",
           "replica_waits", "replicated", "run"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RoundTrip(Step[Any]):
    """One round trip on the client the driving mode holds (sync: ``fn`` answers; asyncio: ``fn``
    returns an awaitable of the answer)."""

    fn: Callable[[Any], Any]


class OnClient(Mode):
    """A sync mode: round trips on ``client`` (and the protocol's other steps as :data:`SYNC` runs them)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def run(self, step: Step[T]) -> T:
        if isinstance(step, RoundTrip):
            return cast(T, step.fn(self.client))
        return SYNC.run(step)


class OnAsyncClient(Mode):
    """An async mode: round trips awaited on the asyncio ``client`` (other steps as :class:`LoopMode`)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._loop = LoopMode()

    async def arun(self, step: Step[T]) -> T:
        if isinstance(step, RoundTrip):
            return cast(T, await step.fn(self.client))
        return await self._loop.arun(step)


def one(step: RoundTrip) -> Steps[Any]:
    """A protocol of one step, answering what the step answers."""
    return (yield from step)


def offloaded(fn: Callable[[], T]) -> RoundTrip:
    """A step that is not a Redis round trip but blocking I/O of another kind (a Kafka read): on the
    sync client it runs in place, on an asyncio one on a worker thread, so the event loop goes on."""

    def step(c: Any) -> Any:
        if isinstance(c, redis.asyncio.Redis | redis.asyncio.RedisCluster):
            return asyncio.to_thread(fn)
        return fn()

    return RoundTrip(step)


def pipelined(fill: Callable[[Any], object]) -> RoundTrip:
    """One round trip of several commands: ``fill`` queues them on a pipeline (no transaction)."""

    def once(c: Any) -> Any:
        pipe = c.pipeline(transaction=False)
        fill(pipe)
        return pipe.execute()

    def step(c: Any) -> Any:
        # on a cluster client, a failover is waited out (its commands are retried the same way)
        window = getattr(c, "failover_s", 0.0)
        if not window:
            return once(c)
        if isinstance(c, AsyncFailoverCluster):
            return aretry_failover(window, lambda: once(c))
        return retry_failover(window, lambda: once(c))

    return RoundTrip(step)


def replica_waits(client: Any, settings: Any) -> Any:
    """The :class:`~runlog.projections._replicas.ReplicaWaits` of the SDK's durable claims on ``client`` (the
    sync one), from ``RUNLOG_REDIS_WAIT_REPLICAS`` / ``_MS``: on a cluster ("auto") one replica of
    each primary written to that has one online, none on a standalone server unless a number is set."""
    from runlog.projections.internal import ReplicaWaits
    from runlog.schemas.internal import is_cluster

    return ReplicaWaits(client, cluster=is_cluster(client), replicas=settings.redis_wait_replicas,
                        timeout_ms=settings.redis_wait_ms)


def replicated(plain: RoundTrip, fill: Callable[[Any], object], keys: list[str], waits: Any,
               sync_client: Any) -> RoundTrip:
    """A write that a replica must hold before it answers, where Redis has replicas to wait for.

    ``plain`` is the write as one step (used when ``waits`` is None or not enabled: a standalone
    server, ``RUNLOG_REDIS_WAIT_REPLICAS=0``). Otherwise ``fill`` queues the same writes (to ``keys``)
    on a pipeline that ends with a ``WAIT`` on the connection that wrote, per primary written to
    (:class:`~runlog.projections._replicas.ReplicaWaits`), and the step answers the first write's answer,
    or raises :class:`~runlog.projections._replicas.ReplicasBehind` (a ``RunlogError``) when the replicas
    did not acknowledge in time: the write is not known to survive a failover, so nothing that
    depends on it may act. An asyncio client runs that round trip on ``sync_client`` in a thread
    (the waits are planned with the sync cluster client's nodes)."""

    def sync(c: Any) -> Any:
        pipe = c.pipeline(transaction=False)
        fill(pipe)
        check = waits.after(pipe, keys)
        results = check(pipe.execute(raise_on_error=False))
        first = results[0]
        if isinstance(first, Exception):
            raise first
        return first

    def once(c: Any) -> Any:
        window = getattr(c, "failover_s", 0.0)
        return retry_failover(window, lambda: sync(c)) if window else sync(c)

    def step(c: Any) -> Any:
        if waits is None or not waits.enabled:
            return plain.fn(c)
        if isinstance(c, redis.asyncio.Redis | redis.asyncio.RedisCluster):
            import asyncio

            return asyncio.to_thread(once, sync_client)
        return once(c)

    return RoundTrip(step)


def run(steps: Steps[T], client: redis.Redis) -> T:
    """Drive ``steps`` on the sync client, one blocking round trip a step (no event loop)."""
    return drive(steps, OnClient(client))


async def arun(steps: Steps[T], aclient: redis.asyncio.Redis | None, client: redis.Redis) -> T:
    """Await ``steps`` on the asyncio client; without one, :func:`run` them on the sync ``client``."""
    if aclient is None:
        return run(steps, client)
    return await adrive(steps, OnAsyncClient(aclient))


class Lua:
    """A Lua script of a port: registered on its sync client, and on the asyncio client at first use.

    Both faces run the same source (hence the same sha); redis-py loads it where the server
    lacks it (``NOSCRIPT``), in a pipeline before the pipeline runs.
    """

    def __init__(self, source: str, client: redis.Redis) -> None:
        self.source = source
        self._sync = client.register_script(source)
        self._aio: Any = None

    def _on(self, c: Any) -> Any:
        # an asyncio pipeline is a redis.asyncio.Redis as well; an asyncio cluster pipeline is neither
        if not isinstance(c, redis.asyncio.Redis | redis.asyncio.RedisCluster
                          | redis.asyncio.cluster.ClusterPipeline):
            return self._sync
        if self._aio is None:
            self._aio = redis.asyncio.Redis.register_script(c, self.source)  # type: ignore[arg-type]
        return self._aio

    def step(self, keys: list[str], args: list[Any]) -> RoundTrip:
        """Run the script (one round trip) on the client the step is given."""
        return RoundTrip(lambda c: self._on(c)(keys=keys, args=args, client=c))

    def replicated_step(self, keys: list[str], args: list[Any], waits: Any, sync_client: Any) -> RoundTrip:
        """:meth:`step`, answered once a replica holds its writes where there are replicas to wait
        for (:func:`replicated`)."""
        return replicated(self.step(keys, args), lambda pipe: self.queue(pipe, keys, args), keys, waits,
                          sync_client)

    def queue(self, pipe: Any, keys: list[str], args: list[Any]) -> None:
        """Queue the script on a pipeline, sync or asyncio (queueing is no round trip on either).
        A Redis Cluster pipeline has no script cache to load from (and blocks its ``eval`` and
        ``evalsha`` methods): it sends the source as a raw EVAL, routed by its keys."""
        if not hasattr(pipe, "scripts"):
            pipe.execute_command("EVAL", self.source, len(keys), *keys, *args)
            return
        script = self._on(pipe)
        pipe.scripts.add(script)
        pipe.evalsha(script.sha, len(keys), *keys, *args)
