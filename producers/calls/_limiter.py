"""Rate limits a fleet shares: requests and tokens per period for one key (a model, a provider
account), held in Redis so every process that calls the provider counts against one budget.

A tool declares its limit (:class:`~runlog.producers.RateLimit`). Before each attempt of a call the
runner asks the limiter for one request and the estimated tokens (the tool's ``estimate``); the
limiter grants them or says how long to wait. A wait of at most :attr:`Limiter.durable_after_s` is
waited in the call's thread (or its task on the loop: the run keeps its lease, and re-checks it while
it waits); a longer one is durable where the call may: the call *reserves* its request and tokens
(:meth:`Limiter.reserve`: taken now, into debt, so its place is kept and later callers wait behind
it), ``RUN_WAITING`` (signal ``runlog.limit``, deadline = when the budget covers the reservation) is
appended and the run let go, holding no lease and no thread, until the fleet's timers wake it at that
time and the call goes on without another take (:mod:`runlog.producers.calls._throttle`).
After the call the tokens the provider reported (the tool's ``usage``, what ``TOOL_RESULT``
records) settle the bucket: an estimate too low becomes a debt the next calls wait out, one too
high is given back. A tool that raises :class:`~runlog.producers.RateLimited` (a provider's 429 with
its ``Retry-After``) blocks the key for that long for every process sharing it, not only the one that
got it; the call is retried by its retry policy (and its retry waits for the block like any other
wait). What a call waited (in its thread and durably) and how often it was throttled are recorded on
its ``TOOL_RESULT`` (attributes ``limit_wait_ms``, ``rate_limited``).

Buckets refill continuously (``capacity / per_s`` a second) and start full; the clock is Redis's
own (``TIME``), so processes on hosts whose clocks disagree share one budget. One key per limit
(``{prefix}:limits:{<key>}``, a hash, expiring once idle for two periods): safe on a Redis Cluster.
A limit is a rate, not a fact of any run: a Redis that lost it starts full again.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Protocol

from runlog.producers.define._limits import RateLimit

__all__ = ["InMemoryLimiter", "Limiter", "RedisLimiter"]


class Limiter(Protocol):
    """Where limits are counted: :class:`RedisLimiter` (a fleet) or :class:`InMemoryLimiter` (a test)."""

    durable_after_s: float
    """A wait longer than this lets go of the run (durable: no lease, no thread) instead of being waited
    in its thread, where the call may (``RUNLOG_LIMIT_DURABLE_WAIT_MS`` for the fleet's limiter)."""

    def take(self, limit: RateLimit, tokens: int) -> float:
        """Take one request and ``tokens``; returns 0 when granted, else the seconds to wait before
        asking again (nothing was taken)."""

    def settle(self, limit: RateLimit, estimated: int, actual: int) -> None:
        """The call that took ``estimated`` tokens spent ``actual``: the difference is a debt or a refund."""

    def block(self, limit: RateLimit, seconds: float) -> None:
        """Nothing is granted for ``limit`` for ``seconds`` (a provider's ``Retry-After``)."""

    def reserve(self, limit: RateLimit, tokens: int) -> float:
        """Take one request and ``tokens`` now, into debt if need be; returns the seconds until the
        budget covers them (0: at once). The caller waits that long and calls without another take
        (a durable wait: its place is kept, later callers wait behind it)."""


_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local per = tonumber(ARGV[1])
local rcap, tcap = tonumber(ARGV[2]), tonumber(ARGV[3])
local want = tonumber(ARGV[4])
local mode = ARGV[5]
local h = redis.call('HMGET', KEYS[1], 'r', 't', 'ts', 'blocked')
local ts = tonumber(h[3]) or now
local r = tonumber(h[1]) or rcap
local tk = tonumber(h[2]) or tcap
local blocked = tonumber(h[4]) or 0
local dt = math.max(0, now - ts)
if rcap > 0 then r = math.min(rcap, r + dt * rcap / per) end
if tcap > 0 then tk = math.min(tcap, tk + dt * tcap / per) end
local wait = 0
if mode == 'take' then
  if blocked > now then
    wait = blocked - now
  else
    if rcap > 0 and r < 1 then wait = math.max(wait, (1 - r) * per / rcap) end
    local need = math.min(want, tcap)
    if tcap > 0 and tk < need then wait = math.max(wait, (need - tk) * per / tcap) end
    if wait == 0 then
      if rcap > 0 then r = r - 1 end
      if tcap > 0 then tk = tk - want end
    end
  end
elseif mode == 'reserve' then
  if blocked > now then wait = blocked - now end
  if rcap > 0 then
    r = r - 1
    if r < 0 then wait = math.max(wait, -r * per / rcap) end
  end
  if tcap > 0 then
    tk = tk - want
    if tk < 0 then wait = math.max(wait, -tk * per / tcap) end
  end
elseif mode == 'settle' then
  if tcap > 0 then tk = math.min(tcap, tk - want) end
elseif mode == 'block' then
  blocked = math.max(blocked, now + want)
end
redis.call('HSET', KEYS[1], 'r', tostring(r), 't', tostring(tk), 'ts', now, 'blocked', blocked)
redis.call('PEXPIRE', KEYS[1], math.ceil(per * 2 + math.max(0, blocked - now)))
return tostring(wait)
"""


class RedisLimiter:
    """Limits held in Redis for every process sharing ``prefix`` (the module docstring)."""

    def __init__(self, client: Any, prefix: str, *, durable_after_s: float = 2.0) -> None:
        self.client = client
        self.prefix = prefix
        self.durable_after_s = durable_after_s
        self._script = client.register_script(_TAKE)

    def key(self, limit: RateLimit) -> str:
        return f"{self.prefix}:limits:{{{limit.key}}}"

    def _call(self, limit: RateLimit, want: float, mode: str) -> float:
        raw = self._script(keys=[self.key(limit)],
                           args=[int(limit.per_s * 1000), limit.requests or 0, limit.tokens or 0, want, mode])
        return float(raw) / 1000.0

    def take(self, limit: RateLimit, tokens: int) -> float:
        return self._call(limit, max(0, tokens), "take")

    def settle(self, limit: RateLimit, estimated: int, actual: int) -> None:
        if limit.tokens is not None and actual != estimated:
            self._call(limit, actual - estimated, "settle")

    def block(self, limit: RateLimit, seconds: float) -> None:
        self._call(limit, max(0.0, seconds) * 1000.0, "block")

    def reserve(self, limit: RateLimit, tokens: int) -> float:
        return self._call(limit, max(0, tokens), "reserve")


class InMemoryLimiter:
    """:class:`RedisLimiter`'s twin in one process (unit tests), on the process's monotonic clock."""

    def __init__(self, clock: Any = time.monotonic, *, durable_after_s: float = math.inf) -> None:
        self.clock = clock
        self.durable_after_s = durable_after_s  # one process: every wait in its thread unless told
        self._lock = threading.Lock()
        self._state: dict[str, list[float]] = {}

    def _refilled(self, limit: RateLimit) -> list[float]:
        now = self.clock()
        rcap, tcap = float(limit.requests or 0), float(limit.tokens or 0)
        st = self._state.setdefault(limit.key, [rcap, tcap, now, 0.0])
        dt = max(0.0, now - st[2])
        if rcap:
            st[0] = min(rcap, st[0] + dt * rcap / limit.per_s)
        if tcap:
            st[1] = min(tcap, st[1] + dt * tcap / limit.per_s)
        st[2] = now
        return st

    def take(self, limit: RateLimit, tokens: int) -> float:
        with self._lock:
            st = self._refilled(limit)
            now = st[2]
            if st[3] > now:
                return st[3] - now
            wait = 0.0
            if limit.requests and st[0] < 1:
                wait = max(wait, (1 - st[0]) * limit.per_s / limit.requests)
            need = min(tokens, limit.tokens or 0)
            if limit.tokens and st[1] < need:
                wait = max(wait, (need - st[1]) * limit.per_s / limit.tokens)
            if wait == 0:
                if limit.requests:
                    st[0] -= 1
                if limit.tokens:
                    st[1] -= tokens
            return wait

    def settle(self, limit: RateLimit, estimated: int, actual: int) -> None:
        with self._lock:
            st = self._refilled(limit)
            if limit.tokens:
                st[1] = min(float(limit.tokens), st[1] - (actual - estimated))

    def block(self, limit: RateLimit, seconds: float) -> None:
        with self._lock:
            st = self._refilled(limit)
            st[3] = max(st[3], st[2] + max(0.0, seconds))

    def reserve(self, limit: RateLimit, tokens: int) -> float:
        with self._lock:
            st = self._refilled(limit)
            wait = max(0.0, st[3] - st[2])
            if limit.requests:
                st[0] -= 1
                wait = max(wait, -st[0] * limit.per_s / limit.requests)
            if limit.tokens:
                st[1] -= tokens
                wait = max(wait, -st[1] * limit.per_s / limit.tokens)
            return wait
