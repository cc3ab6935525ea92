"""One effects ledger for all runs: a delivery key names one effect in the world, whichever run asks.

Before an effect tool executes, the writer *opens* its delivery key in the ledger
(:meth:`EffectLedger.open`). Three answers:

* ``None``: this call owns the key now (no run held it, the holder was this very
  call, or the holder's attempt failed): go on, append the intent, execute;
* an entry of another run that is *done* (``DONE`` / ``RECONCILED``, with an
  external id): do not execute; the run records ``EFFECT_RECONCILED`` with that
  external id and where it came from;
* an entry of another run that is *open* (an intent without a result, in doubt):
  the tool's replay policy decides (``RECONCILE_FIRST`` asks the external system,
  ``NEVER`` blocks the run for a person, ``IDEMPOTENT`` calls with the holder's
  idempotency key, ``SAFE`` executes).

The Redis adapter keeps a writer-side claim per delivery key,
``{prefix}:{<delivery_key>}:effect`` (hash-tagged on the key, so one Cluster slot),
written atomically before the intent and moved to done or failed after the call,
so runs racing on one key see each other at once, without waiting for a
projector. Keys the claims do not know (effects recorded before claims existed,
or claims lost with Redis) are looked up in the projected index
``{prefix}:effects:by_key``, which the projector rebuilds from the log (on Redis Cluster,
its shard ``{prefix}:{idx:<n>}:effects:by_key``, ``n`` = ``runlog.schemas._redis.index_shard(key)``).

``aopen`` / ``aclose_effect`` are the same calls for an event loop: with an asyncio
client, the Redis adapter awaits the same round trips on it.
"""

from __future__ import annotations

import abc
import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio

from runlog.producers.base._redis_io import Lua, RoundTrip, Steps, arun, offloaded, pipelined, run
from runlog.producers.calls._keys import canonical_json
from runlog.projections import ProjectionStoreError
from runlog.projections.internal import READY, marker_key, parse_marker
from runlog.schemas import EffectStatus, now_ms
from runlog.schemas.errors import RunlogError
from runlog.schemas.internal import index_shard, is_cluster

__all__ = ["EffectLedger", "InMemoryEffectLedger", "LedgerEntry", "LedgerUnavailable", "RedisEffectLedger"]

_DONE = (EffectStatus.DONE, EffectStatus.RECONCILED)


class LedgerUnavailable(RunlogError):
    """The effects ledger could not be read or written (Redis unreachable, or a failover left a
    write not known to be on a replica). The runner lets go of the run as a crash would, appending
    no ``FAILED``: a resumer continues it from the log once Redis answers (the state between a claim
    and its ``EFFECT_INTENT`` is one the crash points cover)."""


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """Who holds a delivery key, and how far that effect got."""

    delivery_key: str
    run_id: str
    call_id: str | None
    status: EffectStatus
    external_id: str | None = None
    idempotency_key: str | None = None
    tool: str | None = None
    source: str = "claim"
    """``claim`` (the writers' ledger) or ``projection`` (the projected index)."""

    @property
    def done(self) -> bool:
        return self.status in _DONE and bool(self.external_id)

    def to_json(self) -> bytes:
        return canonical_json({"run_id": self.run_id, "call_id": self.call_id, "status": self.status.value,
                               "external_id": self.external_id, "idempotency_key": self.idempotency_key,
                               "tool": self.tool, "at": now_ms()})

    @classmethod
    def from_json(cls, delivery_key: str, raw: bytes | str, source: str = "claim") -> LedgerEntry:
        d: dict[str, Any] = json.loads(raw)
        try:
            status = EffectStatus(d.get("status") or "UNKNOWN")
        except ValueError:
            status = EffectStatus.UNKNOWN
        return cls(delivery_key, str(d["run_id"]), d.get("call_id"), status, d.get("external_id"),
                   d.get("idempotency_key"), d.get("tool"), source)


class EffectLedger(abc.ABC):
    """The port: claims on delivery keys across runs."""

    @abc.abstractmethod
    def open(self, entry: LedgerEntry) -> LedgerEntry | None:
        """Claim ``entry.delivery_key`` for ``(entry.run_id, entry.call_id)`` (status ``INTENT``).

        Returns None when this call holds the key now; else the other run's entry, unchanged.
        """

    @abc.abstractmethod
    def close(self, delivery_key: str, run_id: str, call_id: str | None, status: EffectStatus,
              external_id: str | None = None) -> None:
        """Record how the effect ended (``DONE`` / ``RECONCILED`` with its external id, or
        ``FAILED``). A done effect is done whoever holds the claim; a failure only moves
        the holder's own claim."""

    @abc.abstractmethod
    def lookup(self, delivery_key: str) -> LedgerEntry | None:
        """The entry holding ``delivery_key``, if any."""

    async def aopen(self, entry: LedgerEntry) -> LedgerEntry | None:
        """:meth:`open` for an event loop (default: the sync one)."""
        return self.open(entry)

    async def aclose_effect(self, delivery_key: str, run_id: str, call_id: str | None, status: EffectStatus,
                            external_id: str | None = None) -> None:
        """:meth:`close` for an event loop (default: the sync one)."""
        self.close(delivery_key, run_id, call_id, status, external_id)


def _decide(cur: LedgerEntry | None, entry: LedgerEntry) -> bool:
    """Whether ``entry`` may take the key from ``cur`` (the rule both adapters share; the Redis one
    applies it to a projected entry too)."""
    if cur is None:
        return True
    if cur.run_id == entry.run_id and cur.call_id == entry.call_id:
        return not cur.done  # the same call again (a resume): still ours unless already done
    return cur.status is EffectStatus.FAILED


class InMemoryEffectLedger(EffectLedger):
    """The ledger in a dict (unit tests, one process)."""

    def __init__(self) -> None:
        self._d: dict[str, LedgerEntry] = {}
        self._lock = threading.Lock()

    def open(self, entry: LedgerEntry) -> LedgerEntry | None:
        with self._lock:
            cur = self._d.get(entry.delivery_key)
            if _decide(cur, entry):
                self._d[entry.delivery_key] = entry
                return None
            return cur

    def close(self, delivery_key: str, run_id: str, call_id: str | None, status: EffectStatus,
              external_id: str | None = None) -> None:
        with self._lock:
            cur = self._d.get(delivery_key)
            if status in _DONE:
                if cur is None or not cur.done:
                    base = cur if cur is not None and cur.run_id == run_id else None
                    self._d[delivery_key] = LedgerEntry(delivery_key, run_id, call_id, status, external_id,
                                                        base.idempotency_key if base else None,
                                                        base.tool if base else None)
            elif cur is not None and cur.run_id == run_id and cur.call_id == call_id and not cur.done:
                self._d[delivery_key] = LedgerEntry(delivery_key, run_id, call_id, status, None,
                                                    cur.idempotency_key, cur.tool)

    def lookup(self, delivery_key: str) -> LedgerEntry | None:
        with self._lock:
            return self._d.get(delivery_key)


# KEYS[1] the claim. ARGV: 1 entry JSON, 2 run_id, 3 call_id.
# Returns nil when the caller holds the claim now, else the current claim's JSON.
_OPEN = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local e = cjson.decode(cur)
  local done = (e.status == 'DONE' or e.status == 'RECONCILED') and e.external_id ~= cjson.null
  local same = e.run_id == ARGV[2] and e.call_id == ARGV[3]
  if done or (not same and e.status ~= 'FAILED') then return cur end
end
redis.call('SET', KEYS[1], ARGV[1])
return false
"""

# KEYS[1] the claim. ARGV: 1 entry JSON, 2 run_id, 3 call_id, 4 '1' when the status is done.
_CLOSE = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local e = cjson.decode(cur)
  if (e.status == 'DONE' or e.status == 'RECONCILED') and e.external_id ~= cjson.null then return 0 end
  if ARGV[4] ~= '1' and not (e.run_id == ARGV[2] and e.call_id == ARGV[3]) then return 0 end
elseif ARGV[4] ~= '1' then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
return 1
"""


class RedisEffectLedger(EffectLedger):
    """Writer-side claims in Redis, with the projected index as the fallback for lookups.

    Args:
        client: the sync connection.
        prefix: ``settings.redis_prefix``.
        aclient: an asyncio connection for ``aopen`` / ``aclose_effect`` (without one they
            are the sync calls).
    """

    def __init__(self, client: redis.Redis, prefix: str, *,
                 aclient: redis.asyncio.Redis | None = None, waits: Any = None,
                 effects_topic: Callable[[str], LedgerEntry | None] | None = None) -> None:
        self._r = client
        self._ar = aclient
        self.prefix = prefix
        self.effects_topic = effects_topic
        """Looks a key up in the compacted effects topic
        (:class:`~runlog.producers.calls._ledger_topic.EffectsTopic`) when Redis has neither its claim nor a
        ready projection; None: Redis is the only source."""
        self.waits = waits
        """:func:`~runlog.producers.base._redis_io.replica_waits`: a claim is answered once a replica holds it
        (None:
        never waits). A claim a failover could take back would let another run execute the effect."""
        self._open = Lua(_OPEN, client)
        self._close = Lua(_CLOSE, client)
        self._cluster = is_cluster(client)

    def claim_key(self, delivery_key: str) -> str:
        return f"{self.prefix}:{{{delivery_key}}}:effect"

    @property
    def index_key(self) -> str:
        return f"{self.prefix}:effects:by_key"

    def index_key_of(self, delivery_key: str) -> str:
        """The projected index's key holding ``delivery_key`` (its shard on Redis Cluster)."""
        if self._cluster:
            return f"{self.prefix}:{{idx:{index_shard(delivery_key)}}}:effects:by_key"
        return self.index_key

    @staticmethod
    @contextlib.contextmanager
    def _failing(doing: str, delivery_key: str) -> Iterator[None]:
        try:
            yield
        except (redis.RedisError, ProjectionStoreError) as err:  # a failover, Redis unreachable
            raise LedgerUnavailable(f"effects ledger: {doing} {delivery_key[:16]}... failed: {err}") from err

    # -- the protocol, once (see runlog.producers.base._redis_io); the sync and async faces drive it

    def _projected(self, delivery_key: str) -> Steps[LedgerEntry | None]:
        key = self.index_key_of(delivery_key)
        raw = yield from RoundTrip(lambda c: c.hget(key, delivery_key))
        return None if raw is None else LedgerEntry.from_json(delivery_key, raw, "projection")

    def _opened(self, entry: LedgerEntry) -> Steps[LedgerEntry | None]:
        dk = entry.delivery_key
        if self.effects_topic is None:
            proj = yield from self._projected(dk)
        else:
            proj = yield from self._projected_or_topic(entry)
        if proj is not None and not _decide(proj, entry) \
                and (yield from RoundTrip(lambda c: c.get(self.claim_key(dk)))) is None:
            return proj  # known to the log (projected), not to the claims, and it holds the key by their rule
        raw = yield from self._open.replicated_step([self.claim_key(dk)],
                                                    [entry.to_json(), entry.run_id, entry.call_id or ""],
                                                    self.waits, self._r)
        return None if raw is None else LedgerEntry.from_json(dk, raw)

    def _projected_or_topic(self, entry: LedgerEntry) -> Steps[LedgerEntry | None]:
        """The projected entry, in the same round trip as the claim's existence and the namespace
        marker. Neither claim nor projection knows the key and no ready projection says it is
        unknown (Redis lost its data, or is being rebuilt): the compacted effects topic is asked."""
        assert self.effects_topic is not None
        dk = entry.delivery_key
        ikey, ckey, mkey = self.index_key_of(dk), self.claim_key(dk), marker_key(self.prefix)
        raw, claimed, marker_raw = yield from pipelined(
            lambda p: (p.hget(ikey, dk), p.exists(ckey), p.hgetall(mkey)))
        if raw is not None:
            return LedgerEntry.from_json(dk, raw, "projection")
        if claimed:
            return None  # the claim decides
        marker = parse_marker(marker_raw)
        if marker is not None and marker.state == READY:
            return None  # a whole projection that lacks the key: the log has no such effect
        topic = self.effects_topic
        # a Kafka read: off the loop (async)
        found: LedgerEntry | None = yield from offloaded(lambda: topic(dk))
        if found is None or (found.run_id == entry.run_id and not found.done):
            return None  # unknown, or this run's own open effect (a resume): the claim is taken
        return found

    def _closed(self, delivery_key: str, run_id: str, call_id: str | None, status: EffectStatus,
                external_id: str | None) -> Steps[None]:
        value = LedgerEntry(delivery_key, run_id, call_id, status, external_id).to_json()
        yield from self._close.step([self.claim_key(delivery_key)],
                                    [value, run_id, call_id or "", "1" if status in _DONE else "0"])

    def open(self, entry: LedgerEntry) -> LedgerEntry | None:
        with self._failing("opening", entry.delivery_key):
            return run(self._opened(entry), self._r)

    async def aopen(self, entry: LedgerEntry) -> LedgerEntry | None:
        with self._failing("opening", entry.delivery_key):
            return await arun(self._opened(entry), self._ar, self._r)

    def close(self, delivery_key: str, run_id: str, call_id: str | None, status: EffectStatus,
              external_id: str | None = None) -> None:
        with self._failing("closing", delivery_key):
            run(self._closed(delivery_key, run_id, call_id, status, external_id), self._r)

    async def aclose_effect(self, delivery_key: str, run_id: str, call_id: str | None, status: EffectStatus,
                            external_id: str | None = None) -> None:
        with self._failing("closing", delivery_key):
            await arun(self._closed(delivery_key, run_id, call_id, status, external_id), self._ar, self._r)

    def lookup(self, delivery_key: str) -> LedgerEntry | None:
        with self._failing("reading", delivery_key):
            raw = self._r.get(self.claim_key(delivery_key))
            if raw is not None:
                return LedgerEntry.from_json(delivery_key, raw)
            return run(self._projected(delivery_key), self._r)
