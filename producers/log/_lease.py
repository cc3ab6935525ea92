"""The single-writer lease on a run: an interface and the Redis adapter.

Keys (hash-tagged per run, so one Redis Cluster slot):

* ``{prefix}:{<run_id>}:epoch`` counter; each acquisition INCRs it, so epochs
  only grow;
* ``{prefix}:{<run_id>}:lease`` = ``"<holder>|<epoch>"`` with PX ``lease_ttl_ms``.

Acquire, heartbeat and release are Lua scripts (atomic). One background thread
per :class:`RedisLeaseManager` heartbeats every lease it holds every ttl/3; a
heartbeat that finds another holder or epoch marks the lease lost.
:class:`AsyncRedisLeaseManager` is the same protocol
on redis-py's asyncio client as well: ``aacquire`` / ``averify`` / ``arelease`` are awaited on
the event loop, while the heartbeat stays a thread with a connection of its own, so a loop
saturated by thousands of runs cannot starve it (measured: with 10,000 runs on one loop a
heartbeat task started up to 11 s late and leases aged out; the thread kept every lease). A writer
checks its lease before every append and effect (:meth:`Lease.check`): lost,
or no successful heartbeat within ``ttl - margin``, raises
:class:`~runlog.schemas.errors.LeaseLost`.

Redis timing is not what makes writes safe: a paused writer may still append
after its lease expired, but its events carry the old epoch and the fold fences
them. The lease only keeps honest writers from stepping on each other.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import threading
import time
import uuid
from typing import Any

import redis
import redis.asyncio

from runlog.producers.base._redis_io import Lua, RoundTrip, Steps, arun, pipelined, run
from runlog.producers.log._lease_beats import CoalescedBeats
from runlog.schemas.errors import LeaseLost, RunlogError
from runlog.schemas.internal import TOKEN_EXTEND, TOKEN_RELEASE
from runlog.schemas.settings import Settings

__all__ = ["AsyncRedisLeaseManager", "Lease", "LeaseHeld", "LeaseManager", "RedisLease", "RedisLeaseManager",
           "lease_key"]



def lease_key(prefix: str, run_id: str) -> str:
    """The Redis key of a run's lease (``"<holder>|<epoch>"`` with a ttl): one definition for the
    writer, the resumer and the tools that wait for a dead writer's lease to expire."""
    return f"{prefix}:{{{run_id}}}:lease"

class LeaseHeld(RunlogError):
    """Another writer holds the run's lease (acquire without ``force``)."""

    def __init__(self, run_id: str, holder: str) -> None:
        self.run_id = run_id
        self.holder = holder
        super().__init__(f"run {run_id!r} is leased by {holder!r}")


class Lease(abc.ABC):
    """Ownership of one run by one writer at one epoch."""

    run_id: str
    epoch: int
    holder: str

    @abc.abstractmethod
    def check(self) -> None:
        """Raise LeaseLost unless the lease is still believed held (local, no I/O)."""

    @abc.abstractmethod
    def verify(self) -> None:
        """Like :meth:`check`, plus one round trip to the lease store (before every tool call and
        effect: a writer whose lease was taken over starts nothing more)."""

    @abc.abstractmethod
    def heartbeat(self) -> bool:
        """Extend the lease now; False (and lost from then on) when it is not ours."""

    @abc.abstractmethod
    def release(self) -> None:
        """Give the lease up if still ours (the epoch counter stays)."""

    async def averify(self) -> None:
        """:meth:`verify` for an event loop (default: the sync one, right when it does no I/O)."""
        self.verify()

    async def arelease(self) -> None:
        """:meth:`release` for an event loop (default: the sync one, right when it does no I/O)."""
        self.release()


class LeaseManager(abc.ABC):
    """Hands out leases."""

    @abc.abstractmethod
    def acquire(self, run_id: str, *, force: bool = False, epoch: int = 0) -> Lease:
        """The lease at a new epoch, higher than ``epoch`` and than any this manager handed out.

        Raises LeaseHeld when another writer holds it, unless ``force`` (a
        takeover: the old holder loses it). ``epoch``: the run's epoch as the log
        records it (a taker-over passes the fold's), so a reset counter can never
        hand out an epoch the fold would fence.
        """

    def close(self) -> None:
        """Stop keeping leases alive (held leases then run out); default: nothing to stop."""
        return None

    async def aacquire(self, run_id: str, *, force: bool = False, epoch: int = 0) -> Lease:
        """:meth:`acquire` for an event loop (default: the sync one)."""
        return self.acquire(run_id, force=force, epoch=epoch)

    async def aclose(self) -> None:
        """:meth:`close` for an event loop (default: the sync one)."""
        self.close()


_ACQUIRE = """
local cur = redis.call('GET', KEYS[2])
if cur and ARGV[3] ~= '1' then return {0, cur} end
local epoch = redis.call('INCR', KEYS[1])
if epoch < tonumber(ARGV[4]) then
  epoch = tonumber(ARGV[4]); redis.call('SET', KEYS[1], epoch)
end
redis.call('SET', KEYS[2], ARGV[1] .. '|' .. epoch, 'PX', ARGV[2])
return {epoch, ''}
"""


class RedisLease(Lease):
    """A lease held in Redis; kept alive by its manager's heartbeat (a thread, or an asyncio task).

    ``averify`` / ``arelease`` are awaited on the manager's asyncio client when it has one
    (:class:`AsyncRedisLeaseManager`), else they are the sync calls.
    """

    def __init__(self, manager: RedisLeaseManager, run_id: str, epoch: int) -> None:
        self._m = manager
        self.run_id = run_id
        self.epoch = epoch
        self.holder = manager.holder
        self.token = f"{manager.holder}|{epoch}"
        self.key = manager.lease_key(run_id)
        self._last_ok = time.monotonic()
        self._lost: str | None = None
        self._released = False

    def _fail(self, detail: str) -> LeaseLost:
        if self._lost is None:
            self._lost = detail
        return LeaseLost(self.run_id, self.epoch, self._lost)

    def check(self) -> None:
        if self._lost is not None:
            raise LeaseLost(self.run_id, self.epoch, self._lost)
        if self._released:
            raise self._fail("released")
        age_ms = (time.monotonic() - self._last_ok) * 1000
        if age_ms >= self._m.ttl_ms - self._m.margin_ms:
            raise self._fail(f"no successful heartbeat for {age_ms:.0f} ms")

    # -- the protocol, once (see runlog.producers.base._redis_io); the sync and async faces drive it

    def _beat(self) -> Steps[bool]:
        if self._lost is not None or self._released:
            return False
        at = time.monotonic()  # before the round trip: the extension counts from no later than this
        try:
            ok = int((yield from self._m.extend_step(self.key, self.token))) == 1
        except redis.RedisError:
            return True  # unknown: check() expires it locally if this persists
        self.observe(ok, at)
        return ok

    def _verify(self) -> Steps[None]:
        self.check()
        if not (yield from self._beat()):
            raise LeaseLost(self.run_id, self.epoch, self._lost or "taken over")

    def _release(self) -> Steps[None]:
        if self._released:
            return
        self._released = True
        self._m.forget(self)
        if self._lost is None:
            with contextlib.suppress(redis.RedisError):  # else it expires after the ttl
                yield from self._m.release_step(self.key, self.token)

    def verify(self) -> None:
        run(self._verify(), self._m.client)

    async def averify(self) -> None:
        self.check()
        if not await self._m.abeat(self):
            raise LeaseLost(self.run_id, self.epoch, self._lost or "taken over")

    def heartbeat(self) -> bool:
        return run(self._beat(), self._m.client)

    def observe(self, ok: bool, at: float) -> None:
        if ok:
            self._last_ok = max(self._last_ok, at)
        else:
            self._fail("taken over or expired (lease key no longer holds this epoch)")

    @property
    def lost(self) -> bool:
        return self._lost is not None

    def release(self) -> None:
        run(self._release(), self._m.client)

    async def arelease(self) -> None:
        await arun(self._release(), self._m.aclient, self._m.client)


class RedisLeaseManager(LeaseManager):
    """Acquires leases in Redis and heartbeats all of them from one daemon thread."""

    aclient: redis.asyncio.Redis | None = None
    """The asyncio client the leases' async faces use (:class:`AsyncRedisLeaseManager`); None: sync."""

    def __init__(self, client: redis.Redis, settings: Settings, *, holder: str | None = None,
                 margin_ms: int | None = None, heartbeat_client: redis.Redis | None = None,
                 waits: Any = None) -> None:
        self.client = client
        self.waits = waits
        """:func:`~runlog.producers.base._redis_io.replica_waits`: an acquired epoch is answered once a
        replica holds
        it (None: never waits), so a failover cannot hand the same epoch out twice."""
        self.prefix = settings.redis_prefix
        self.ttl_ms = settings.lease_ttl_ms
        self.margin_ms = margin_ms if margin_ms is not None else max(self.ttl_ms // 4, 50)
        self.holder = holder or f"writer-{uuid.uuid4().hex[:12]}"
        self._acquire = Lua(_ACQUIRE, client)
        self._extend = Lua(TOKEN_EXTEND, client)
        self._release = Lua(TOKEN_RELEASE, client)
        self._leases: dict[int, RedisLease] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.heartbeat_client = heartbeat_client or client
        """The sync connection the heartbeat thread beats on: give it a small pool of its own, so
        it never waits for a connection behind the run threads."""

    def epoch_key(self, run_id: str) -> str:
        return f"{self.prefix}:{{{run_id}}}:epoch"

    def lease_key(self, run_id: str) -> str:
        return lease_key(self.prefix, run_id)

    def extend_step(self, key: str, token: str) -> RoundTrip:
        return self._extend.step([key], [token, self.ttl_ms])

    def release_step(self, key: str, token: str) -> RoundTrip:
        return self._release.step([key], [token])

    def _acquired(self, run_id: str, force: bool, epoch: int) -> Steps[RedisLease]:
        try:
            res = yield from self._acquire.replicated_step(
                [self.epoch_key(run_id), self.lease_key(run_id)],
                [self.holder, self.ttl_ms, "1" if force else "0", epoch + 1], self.waits, self.client)
        except redis.RedisError as err:
            raise LeaseLost(run_id, 0, f"could not acquire: {err}") from err
        epoch, cur = int(res[0]), res[1]
        if epoch == 0:
            raise LeaseHeld(run_id, cur.decode() if isinstance(cur, bytes) else str(cur))
        lease = RedisLease(self, run_id, epoch)
        with self._lock:
            self._leases[id(lease)] = lease
        return lease

    def acquire(self, run_id: str, *, force: bool = False, epoch: int = 0) -> RedisLease:
        lease = run(self._acquired(run_id, force, epoch), self.client)
        self._start_heartbeat()
        return lease

    def _start_heartbeat(self) -> None:
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._loop, name="runlog-lease-heartbeat",
                                                daemon=True)
                self._thread.start()

    def forget(self, lease: RedisLease) -> None:
        with self._lock:
            self._leases.pop(id(lease), None)

    def _beat_all(self) -> Steps[None]:
        """One heartbeat of every live lease, pipelined (one round trip)."""
        with self._lock:
            leases = [x for x in self._leases.values() if not x.lost]
        if leases:
            yield from self.beats(leases)

    def beats(self, leases: list[RedisLease]) -> Steps[list[bool] | None]:
        """One beat of each of ``leases`` in one pipelined round trip, each lease observing its own
        answer: True extended, False taken over or expired; None when Redis did not answer (the
        leases age locally and ``check()`` turns them lost in time)."""
        at = time.monotonic()  # before the round trip: each extension counts from no later than this

        def fill(pipe: Any) -> None:
            for x in leases:
                self._extend.queue(pipe, [x.key], [x.token, self.ttl_ms])

        try:
            results = yield from pipelined(fill)
        except redis.RedisError:
            return None
        oks = [int(r) == 1 for r in results]
        for x, ok in zip(leases, oks, strict=True):
            x.observe(ok, at)
        return oks

    async def abeat(self, lease: RedisLease) -> bool:
        """One beat of ``lease`` for its ``averify``: True extended (or unknown: Redis did not
        answer), False taken over or expired."""
        return await arun(lease._beat(), self.aclient, self.client)

    def _loop(self) -> None:
        while not self._stop.wait(self.ttl_ms / 3000):
            run(self._beat_all(), self.heartbeat_client)

    def close(self) -> None:
        """Stop heartbeating (held leases then expire after the ttl)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


class AsyncRedisLeaseManager(RedisLeaseManager):
    """:class:`RedisLeaseManager` on redis-py's asyncio client too, for a Runner on an event loop.

    :meth:`aacquire` and its leases' ``arelease`` are one awaited round trip each on ``aclient``;
    the ``averify`` of the leases of many runs on one loop share one (:meth:`abeat`).
    Every lease it holds is heartbeaten (pipelined, every ttl/3) by ONE thread on
    ``heartbeat_client``, not by a task on the loop: the loop that runs thousands of runs can be
    seconds behind, and a heartbeat queued behind them lets every lease age out together. The
    thread needs the interpreter only for the pipeline's encoding and parsing, which it gets
    within the switch interval while the loop is busy.

    Args:
        client: the sync connection (the sync :meth:`acquire`).
        aclient: the asyncio connection, used from the loop that calls :meth:`aacquire`.
        heartbeat_client: a sync connection for the heartbeat thread alone (default ``client``).
            Give it its own small pool, so it never waits behind other users of ``client``.
    """

    def __init__(self, client: redis.Redis, aclient: redis.asyncio.Redis, settings: Settings, *,
                 holder: str | None = None, margin_ms: int | None = None,
                 heartbeat_client: redis.Redis | None = None, waits: Any = None) -> None:
        super().__init__(client, settings, holder=holder, margin_ms=margin_ms,
                         heartbeat_client=heartbeat_client, waits=waits)
        self.aclient = aclient
        self._coalesced: CoalescedBeats[RedisLease] = CoalescedBeats(
            lambda leases: arun(self.beats(leases), aclient, client))

    async def abeat(self, lease: RedisLease) -> bool:
        """:meth:`RedisLeaseManager.abeat`, sharing one round trip with the other beats asked for on
        this loop meanwhile (:class:`~runlog.producers.log._lease_beats.CoalescedBeats`)."""
        if lease.lost or lease._released:
            return False
        return await self._coalesced.beat(lease)

    async def aacquire(self, run_id: str, *, force: bool = False, epoch: int = 0) -> RedisLease:
        lease = await arun(self._acquired(run_id, force, epoch), self.aclient, self.client)
        self._start_heartbeat()
        return lease

    async def aclose(self) -> None:
        """Stop the heartbeat thread (off the loop: joining it may wait for one beat)."""
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self.close)
