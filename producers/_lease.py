"""The single-writer lease on a run: an interface and the Redis adapter.

Keys (hash-tagged per run, so one Redis Cluster slot):

* ``{prefix}:{<run_id>}:epoch`` counter; each acquisition INCRs it, so epochs
  only grow;
* ``{prefix}:{<run_id>}:lease`` = ``"<holder>|<epoch>"`` with PX ``lease_ttl_ms``.

Acquire, heartbeat and release are Lua scripts (atomic). One background thread
per :class:`RedisLeaseManager` heartbeats every lease it holds every ttl/3; a
heartbeat that finds another holder or epoch marks the lease lost. A writer
checks its lease before every append and effect (:meth:`Lease.check`): lost,
or no successful heartbeat within ``ttl - margin``, raises
:class:`~schemas.errors.LeaseLost`.

Redis timing is not what makes writes safe: a paused writer may still append
after its lease expired, but its events carry the old epoch and the fold fences
them. The lease only keeps honest writers from stepping on each other.
"""

from __future__ import annotations

import abc
import contextlib
import threading
import time
import uuid
from typing import Any

import redis

from schemas._tokens import TOKEN_EXTEND, TOKEN_RELEASE
from schemas.errors import LeaseLost, RunlogError
from schemas.settings import Settings

__all__ = ["Lease", "LeaseHeld", "LeaseManager", "RedisLease", "RedisLeaseManager"]


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


class LeaseManager(abc.ABC):
    """Hands out leases."""

    @abc.abstractmethod
    def acquire(self, run_id: str, *, force: bool = False, min_epoch: int = 1) -> Lease:
        """A new epoch (at least ``min_epoch``) and the lease.

        Raises LeaseHeld when another writer holds it, unless ``force`` (a
        takeover: the old holder loses it). ``min_epoch`` lets a taker-over
        pass the highest epoch it saw on the log + 1, so a reset counter can
        never hand out an epoch the fold would fence.
        """


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
    """A lease held in Redis; kept alive by its manager's heartbeat thread."""

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

    def verify(self) -> None:
        self.check()
        if not self.heartbeat():
            raise LeaseLost(self.run_id, self.epoch, self._lost or "taken over")

    def heartbeat(self) -> bool:
        if self._lost is not None or self._released:
            return False
        try:
            ok = self._m.run_heartbeat(self.key, self.token)
        except redis.RedisError:
            return True  # unknown: check() expires it locally if this persists
        self.observe(ok, time.monotonic())
        return ok

    def observe(self, ok: bool, at: float) -> None:
        if ok:
            self._last_ok = max(self._last_ok, at)
        else:
            self._fail("taken over or expired (lease key no longer holds this epoch)")

    @property
    def lost(self) -> bool:
        return self._lost is not None

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self._m.forget(self)
        if self._lost is None:
            with contextlib.suppress(redis.RedisError):  # else it expires after the ttl
                self._m.run_release(self.key, self.token)


class RedisLeaseManager(LeaseManager):
    """Acquires leases in Redis and heartbeats all of them from one daemon thread."""

    def __init__(self, client: redis.Redis, settings: Settings, *, holder: str | None = None,
                 margin_ms: int | None = None) -> None:
        self._r = client
        self.prefix = settings.redis_prefix
        self.ttl_ms = settings.lease_ttl_ms
        self.margin_ms = margin_ms if margin_ms is not None else max(self.ttl_ms // 4, 50)
        self.holder = holder or f"writer-{uuid.uuid4().hex[:12]}"
        self._acquire = client.register_script(_ACQUIRE)
        self._hb = client.register_script(TOKEN_EXTEND)
        self._rel = client.register_script(TOKEN_RELEASE)
        self._leases: dict[int, RedisLease] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def epoch_key(self, run_id: str) -> str:
        return f"{self.prefix}:{{{run_id}}}:epoch"

    def lease_key(self, run_id: str) -> str:
        return f"{self.prefix}:{{{run_id}}}:lease"

    def acquire(self, run_id: str, *, force: bool = False, min_epoch: int = 1) -> RedisLease:
        try:
            res: Any = self._acquire(keys=[self.epoch_key(run_id), self.lease_key(run_id)],
                                     args=[self.holder, self.ttl_ms, "1" if force else "0", min_epoch])
        except redis.RedisError as err:
            raise LeaseLost(run_id, 0, f"could not acquire: {err}") from err
        epoch, cur = int(res[0]), res[1]
        if epoch == 0:
            raise LeaseHeld(run_id, cur.decode() if isinstance(cur, bytes) else str(cur))
        lease = RedisLease(self, run_id, epoch)
        with self._lock:
            self._leases[id(lease)] = lease
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="runlog-lease-heartbeat",
                                                daemon=True)
                self._thread.start()
        return lease

    def run_heartbeat(self, key: str, token: str) -> bool:
        return int(self._hb(keys=[key], args=[token, self.ttl_ms])) == 1

    def run_release(self, key: str, token: str) -> None:
        self._rel(keys=[key], args=[token])

    def forget(self, lease: RedisLease) -> None:
        with self._lock:
            self._leases.pop(id(lease), None)

    def _loop(self) -> None:
        interval = self.ttl_ms / 3000
        while not self._stop.wait(interval):
            with self._lock:
                leases = [x for x in self._leases.values() if not x.lost]
            if not leases:
                continue
            at = time.monotonic()
            try:
                pipe = self._r.pipeline(transaction=False)
                for x in leases:
                    self._hb(keys=[x.key], args=[x.token, self.ttl_ms], client=pipe)
                results = pipe.execute()
            except redis.RedisError:
                continue  # leases age locally and check() turns them lost in time
            for x, ok in zip(leases, results, strict=True):
                x.observe(int(ok) == 1, at)

    def close(self) -> None:
        """Stop heartbeating (held leases then expire after the ttl)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
