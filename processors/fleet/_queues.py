"""Queues in Redis a fleet's workers share: the submissions waiting (per tenant, by priority then
submission time), the runs executing (each with an expiry its worker refreshes), the fleet's and each
tenant's concurrency, and weighted fair queuing between tenants.

Every key of one queue shares one hash tag, ``{prefix}:queues:{<group>|<queue>}:...`` (the App's
resumer group and the queue's name: two Apps on one prefix never take each other's submissions), so
each script touches one Redis Cluster slot. The per-tenant pending sets are named inside the scripts
from that base, in the same slot. Keys under the base ``B``:

* ``B:limits`` (hash): ``concurrency``, ``per_tenant`` (0: no cap), ``w:<tenant>``, ``default_weight``
  (written by every worker of the App from its :class:`~runlog.producers.Queue`);
* ``B:p:<tenant>`` (sorted set): the tenant's pending runs, score ``-priority``, member
  ``<submitted_at, 13 digits>|<run id>`` (ties of a score order by member: the earlier first);
* ``B:info`` (hash): run id -> JSON ``{t: tenant, m: member, p: priority, o: owner}`` of a pending or
  running run; ``B:subs`` (hash): run id -> the submission record's bytes;
* ``B:active`` (sorted set): tenants with pending runs by virtual time; ``B:vt`` (hash): each
  tenant's virtual time; ``B:clock``: the virtual time of the last start;
* ``B:running`` (sorted set): running run id -> expiry (ms, Redis's clock); ``B:rt`` (hash): running
  runs per tenant; ``B:starts`` (hash): starts per tenant (the shares ``runlog queues`` shows);
* ``B:started`` (sorted set): run ids started in the last day (a submission delivered again is not
  queued again);
* ``B:built``: set by a rebuild from the log when it starts (:meth:`RedisQueues.mark_built`). Only a
  rebuild writes it, so its absence means the queue's pending runs may be gone (a Redis that lost
  its data, a flush) even after a worker has declared the queue's limits again.

**Fairness** (start-time fair queuing over starts): each start advances its tenant's virtual time
by ``1 / weight``; a dispatch takes the highest priority waiting at the head of any tenant that has
room, and among tenants at that priority the one with the lowest virtual time. A tenant that becomes
active starts at the lowest active virtual time (the last start's when none is active), never below
its own: an idle tenant banks no credit, and a tenant with 10,000 waiting runs does not delay one
with 10 by more than its weight's share.

**Resumes** of a run that was submitted to a queue take a slot of it too (:meth:`RedisQueues.admit`,
``B:info`` entry ``r = 1``): a run that waited durably (a signal, a sleep, its rate limit) or whose
worker died counts against the queue's and its tenant's concurrency while it executes again. A
resume does not wait in the fair order of pending submissions (a run already begun goes first when
a slot is free); refused, it is asked for again a second later.

**Expiry**: a worker refreshes its running entries (``ttl_ms``, the lease TTL); a dispatch first
moves expired entries back to pending (their tenants' counts drop). A run its dead worker had
started is then dispatched again and found started (the keyed start: ``existing``), its slot freed;
its execution is the resumer group's, as for any crashed writer.

Redis is a cache here too: ``rebuild`` (:mod:`runlog.processors.fleet._rebuild`) queues again every
submission on the submissions topic whose run is not on the events topic.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from runlog.producers import Queue

__all__ = ["DEFAULT_TENANT", "Dispatched", "QueueStats", "QueueWait", "RedisQueues", "all_queues",
           "queue_tag", "waiting_runs", "where_waits"]

DEFAULT_TENANT = "-"
"""The tenant of a submission that names none."""

STARTED_KEEP_MS = 86_400_000
"""How long a started run id stays in ``B:started`` (a redelivered submission within it is not queued)."""

_COMMON = """
local base = KEYS[1]
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function activate(tenant)
  if redis.call('ZSCORE', base .. ':active', tenant) then return end
  local own = tonumber(redis.call('HGET', base .. ':vt', tenant)) or 0
  local low = redis.call('ZRANGE', base .. ':active', 0, 0, 'WITHSCORES')
  local floor = tonumber(low[2]) or tonumber(redis.call('GET', base .. ':clock')) or 0
  local v = math.max(own, floor)
  redis.call('HSET', base .. ':vt', tenant, tostring(v))
  redis.call('ZADD', base .. ':active', v, tenant)
end
local function to_pending(run, info)
  redis.call('ZADD', base .. ':p:' .. info.t, -tonumber(info.p), info.m)
  activate(info.t)
end
local function unrun(run, info)
  if redis.call('ZREM', base .. ':running', run) == 1 then
    local left = redis.call('HINCRBY', base .. ':rt', info.t, -1)
    if left <= 0 then redis.call('HDEL', base .. ':rt', info.t) end
    return true
  end
  return false
end
"""

_ENQUEUE = _COMMON + """
local run, tenant, prio, ts = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
if redis.call('HEXISTS', base .. ':info', run) == 1 then return 0 end
if redis.call('ZSCORE', base .. ':started', run) then return 0 end
local info = {t = tenant, m = string.format('%013d', ts) .. '|' .. run, p = tonumber(prio), o = ''}
redis.call('HSET', base .. ':info', run, cjson.encode(info))
redis.call('HSET', base .. ':subs', run, ARGV[5])
to_pending(run, info)
return 1
"""

_DISPATCH = _COMMON + """
local ttl, owner = tonumber(ARGV[1]), ARGV[2]
local now = now_ms()
for _, run in ipairs(redis.call('ZRANGEBYSCORE', base .. ':running', '-inf', now)) do
  local raw = redis.call('HGET', base .. ':info', run)
  if raw then
    local info = cjson.decode(raw)
    unrun(run, info)
    if info.r then  -- an admitted resume whose worker died: its run is the resumer group's again
      redis.call('HDEL', base .. ':info', run)
    else
      info.o = ''
      redis.call('HSET', base .. ':info', run, cjson.encode(info))
      to_pending(run, info)
    end
  else
    redis.call('ZREM', base .. ':running', run)
  end
end
local conc = tonumber(redis.call('HGET', base .. ':limits', 'concurrency')) or 0
local per = tonumber(redis.call('HGET', base .. ':limits', 'per_tenant')) or 0
local active = redis.call('ZRANGE', base .. ':active', 0, -1, 'WITHSCORES')
if #active == 0 then return {'', 'empty'} end
if conc > 0 and redis.call('ZCARD', base .. ':running') >= conc then return {'', 'global'} end
local best, best_score, best_vt, best_member
for i = 1, #active, 2 do
  local tenant, vt = active[i], tonumber(active[i + 1])
  local rc = tonumber(redis.call('HGET', base .. ':rt', tenant)) or 0
  if per == 0 or rc < per then
    local head = redis.call('ZRANGE', base .. ':p:' .. tenant, 0, 0, 'WITHSCORES')
    if head[1] then
      local score = tonumber(head[2])
      if best == nil or score < best_score then
        best, best_score, best_vt, best_member = tenant, score, vt, head[1]
      end
    end
  end
end
if best == nil then return {'', 'tenant'} end
local pending = base .. ':p:' .. best
redis.call('ZREM', pending, best_member)
local run = string.sub(best_member, 15)
local w = tonumber(redis.call('HGET', base .. ':limits', 'w:' .. best))
  or tonumber(redis.call('HGET', base .. ':limits', 'default_weight')) or 1
local nvt = best_vt + 1 / w
redis.call('SET', base .. ':clock', tostring(best_vt))
redis.call('HSET', base .. ':vt', best, tostring(nvt))
if redis.call('ZCARD', pending) == 0 then
  redis.call('ZREM', base .. ':active', best)
else
  redis.call('ZADD', base .. ':active', nvt, best)
end
local raw = redis.call('HGET', base .. ':info', run)
if not raw then return {'', 'empty'} end
local info = cjson.decode(raw)
info.o = owner
redis.call('HSET', base .. ':info', run, cjson.encode(info))
redis.call('ZADD', base .. ':running', now + ttl, run)
redis.call('HINCRBY', base .. ':rt', best, 1)
redis.call('HINCRBY', base .. ':starts', best, 1)
redis.call('ZADD', base .. ':started', now, run)
redis.call('ZREMRANGEBYSCORE', base .. ':started', '-inf', now - tonumber(ARGV[3]))
return {run, best, redis.call('HGET', base .. ':subs', run)}
"""

_ADMIT = _COMMON + """
local run, tenant, ttl, owner = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local now = now_ms()
local exp = redis.call('ZSCORE', base .. ':running', run)
if exp and tonumber(exp) > now then return 'held' end
if exp then  -- expired: the next dispatch would give it back; it is taken back here
  local raw = redis.call('HGET', base .. ':info', run)
  if raw then
    local info = cjson.decode(raw)
    unrun(run, info)
    if not info.r and info.m ~= '' then redis.call('ZREM', base .. ':p:' .. info.t, info.m) end
  else
    redis.call('ZREM', base .. ':running', run)
  end
end
local conc = tonumber(redis.call('HGET', base .. ':limits', 'concurrency')) or 0
local per = tonumber(redis.call('HGET', base .. ':limits', 'per_tenant')) or 0
if conc > 0 and redis.call('ZCARD', base .. ':running') >= conc then return 'global' end
if per > 0 and (tonumber(redis.call('HGET', base .. ':rt', tenant)) or 0) >= per then return 'tenant' end
redis.call('HSET', base .. ':info', run, cjson.encode({t = tenant, m = '', p = 0, o = owner, r = 1}))
redis.call('ZADD', base .. ':running', now + ttl, run)
redis.call('HINCRBY', base .. ':rt', tenant, 1)
return 'ok'
"""

_RELEASE = _COMMON + """
local run, owner, mode = ARGV[1], ARGV[2], ARGV[3]
local raw = redis.call('HGET', base .. ':info', run)
if not raw then return 0 end
local info = cjson.decode(raw)
if info.o ~= owner then
  -- expired and taken back (or taken by another worker since): not this worker's slot any more;
  -- a pending copy of a run that started is dropped
  if mode == 'done' and info.o == '' and redis.call('ZSCORE', base .. ':p:' .. info.t, info.m) then
    redis.call('ZREM', base .. ':p:' .. info.t, info.m)
    if redis.call('ZCARD', base .. ':p:' .. info.t) == 0 then
      redis.call('ZREM', base .. ':active', info.t)
    end
    redis.call('HDEL', base .. ':info', run)
    redis.call('HDEL', base .. ':subs', run)
  end
  return 0
end
unrun(run, info)
if mode == 'again' then
  info.o = ''
  redis.call('HSET', base .. ':info', run, cjson.encode(info))
  redis.call('ZREM', base .. ':started', run)
  to_pending(run, info)
elseif mode == 'drop' then
  redis.call('ZREM', base .. ':started', run)
  redis.call('HDEL', base .. ':info', run)
  redis.call('HDEL', base .. ':subs', run)
else
  redis.call('HDEL', base .. ':info', run)
  redis.call('HDEL', base .. ':subs', run)
end
return 1
"""

_REFRESH = _COMMON + """
local ttl, owner = tonumber(ARGV[1]), ARGV[2]
local now, n = now_ms(), 0
for i = 3, #ARGV do
  local raw = redis.call('HGET', base .. ':info', ARGV[i])
  if raw and cjson.decode(raw).o == owner and redis.call('ZSCORE', base .. ':running', ARGV[i]) then
    redis.call('ZADD', base .. ':running', 'XX', now + ttl, ARGV[i])
    n = n + 1
  end
end
return n
"""


def queue_tag(group: str, queue: str) -> str:
    """The hash tag of ``queue``'s keys for the App whose resumer group is ``group``."""
    return f"{group}|{queue}"


@dataclass(frozen=True)
class Dispatched:
    """A submission a dispatch took for this worker: it runs in ``queue``'s slot until released."""

    queue: str
    run_id: str
    tenant: str
    record: bytes


@dataclass(frozen=True)
class QueueStats:
    """One queue as Redis holds it now (``runlog queues``)."""

    tag: str
    concurrency: int | None
    per_tenant: int | None
    pending: dict[str, int] = field(default_factory=dict)
    running: dict[str, int] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    default_weight: float = 1.0

    @property
    def group(self) -> str:
        return self.tag.rsplit("|", 1)[0]

    @property
    def name(self) -> str:
        return self.tag.rsplit("|", 1)[-1]

    def share(self, tenant: str) -> float:
        """The tenant's share of the queue's starts so far."""
        total = sum(self.starts.values())
        return self.starts.get(tenant, 0) / total if total else 0.0

    def to_dict(self) -> dict[str, Any]:
        tenants = sorted(set(self.pending) | set(self.running) | set(self.starts))
        return {"queue": self.name, "group": self.group, "concurrency": self.concurrency,
                "per_tenant": self.per_tenant, "pending": sum(self.pending.values()),
                "running": sum(self.running.values()),
                "tenants": [{"tenant": t, "pending": self.pending.get(t, 0),
                             "running": self.running.get(t, 0),
                             "starts": self.starts.get(t, 0), "share": round(self.share(t), 4),
                             "weight": self.weights.get(t, self.default_weight)} for t in tenants]}


@dataclass(frozen=True)
class QueueWait:
    """Why a submitted run waits: ``reason`` is ``global`` (the queue's fleet-wide concurrency is
    taken), ``tenant`` (its tenant's is), ``turn`` (room, but a worker has not taken it yet: other
    tenants' turns, higher priorities, no free worker slot) or ``dispatched`` (a worker took it and is
    starting it)."""

    queue: str
    group: str
    tenant: str
    priority: int
    reason: str
    ahead: int
    """Runs of the same tenant before it."""

    def describe(self) -> str:
        why = {"global": "the queue's concurrency is taken", "tenant": f"tenant {self.tenant}'s concurrency "
               "is taken", "turn": "its turn (other tenants' shares, higher priorities, a free worker)",
               "dispatched": "a worker took it and is starting it"}[self.reason]
        return (f"waiting in queue {self.queue} (tenant {self.tenant}, priority {self.priority}, "
                f"{self.ahead} of its tenant's before it): {why}")

    def to_dict(self) -> dict[str, Any]:
        return {"queue": self.queue, "group": self.group, "tenant": self.tenant, "priority": self.priority,
                "reason": self.reason, "ahead": self.ahead}


class RedisQueues:
    """The queues of one App (``group``) under ``prefix`` (the module docstring)."""

    def __init__(self, client: Any, prefix: str, group: str, *, ttl_ms: int = 15_000,
                 owner: str = "") -> None:
        self.client = client
        self.prefix = prefix
        self.group = group
        self.ttl_ms = ttl_ms
        self.owner = owner
        self._enqueue = client.register_script(_ENQUEUE)
        self._dispatch = client.register_script(_DISPATCH)
        self._release = client.register_script(_RELEASE)
        self._refresh = client.register_script(_REFRESH)
        self._admit = client.register_script(_ADMIT)

    def base(self, queue: str) -> str:
        return f"{self.prefix}:queues:{{{queue_tag(self.group, queue)}}}"

    def index_key(self, run_id: str) -> str:
        """Where a waiting run's queue is noted (for status views; not part of any script)."""
        return f"{self.prefix}:queues:at:{run_id}"

    # -- the scripts ----------------------------------------------------------------------------------

    def declare(self, queue: Queue) -> None:
        """Write ``queue``'s limits and weights (every worker does, at start and periodically)."""
        key = f"{self.base(queue.name)}:limits"
        mapping: dict[str, str] = {"concurrency": str(queue.concurrency or 0),
                                   "per_tenant": str(queue.per_tenant or 0),
                                   "default_weight": repr(float(queue.default_weight))}
        mapping.update({f"w:{t}": repr(float(w)) for t, w in queue.weights.items()})
        old = self.client.hkeys(key)
        stale = [k for k in old if (k.decode() if isinstance(k, bytes) else k).startswith("w:")
                 and (k.decode() if isinstance(k, bytes) else k) not in mapping]
        pipe = self.client.pipeline(transaction=False)
        pipe.sadd(tags_key(self.prefix), queue_tag(self.group, queue.name))
        if stale:
            pipe.hdel(key, *stale)
        pipe.hset(key, mapping=mapping)
        pipe.execute()

    def declared(self, queue: str) -> bool:
        return bool(self.client.exists(f"{self.base(queue)}:limits"))

    def built(self, queue: str) -> bool:
        """Whether ``queue``'s keys have been rebuilt from the log since Redis last lost them (the
        ``B:built`` marker; declaring the limits does not set it, so a worker that declares again
        after a loss does not hide the loss from the others)."""
        return bool(self.client.exists(f"{self.base(queue)}:built"))

    def mark_built(self, queue: str) -> None:
        """Note that a rebuild of ``queue`` from the log is under way (set before it reads: a loss
        while it reads deletes the marker again, and the next look rebuilds once more)."""
        self.client.set(f"{self.base(queue)}:built", "1")

    def enqueue(self, queue: str, run_id: str, tenant: str | None, priority: int, submitted_at: int,
                record: bytes) -> bool:
        """Queue a submission; False when it is already pending or running, or started within a day."""
        added = bool(self._enqueue(keys=[self.base(queue)], args=[
            run_id, tenant or DEFAULT_TENANT, int(priority), max(0, int(submitted_at)), record]))
        if added:
            pipe = self.client.pipeline(transaction=False)
            pipe.set(self.index_key(run_id), queue_tag(self.group, queue), ex=7 * 86_400)
            pipe.sadd(tags_key(self.prefix), queue_tag(self.group, queue))
            pipe.execute()
        return added

    def dispatch(self, queue: str) -> Dispatched | str:
        """Take the next submission by priority and fairness within the limits, or say why none
        (``empty``, ``global``, ``tenant``)."""
        out = self._dispatch(keys=[self.base(queue)], args=[self.ttl_ms, self.owner, STARTED_KEEP_MS])
        run = _text(out[0])
        if not run:
            return _text(out[1])
        # the index stays until the run's slot is released for good: until then its status says
        # ``dispatched`` (a worker is starting it), and a slot that expires puts it back where it waits
        return Dispatched(queue, run, _text(out[1]), bytes(out[2]) if out[2] is not None else b"")

    def release(self, queue: str, run_id: str, *, mode: str = "done") -> bool:
        """Free the run's slot. ``mode``: ``done`` (it started, or never will: dead-lettered),
        ``again`` (it could not be started now: it waits again, ahead of its tenant's later
        submissions), ``drop`` (it left the queue unstarted: parked for a member serving its version,
        which queues it again)."""
        done = bool(self._release(keys=[self.base(queue)], args=[run_id, self.owner, mode]))
        if mode == "again":
            if done:
                self.client.set(self.index_key(run_id), queue_tag(self.group, queue), ex=7 * 86_400)
        elif done or not self.client.hexists(f"{self.base(queue)}:info", run_id):
            self.client.delete(self.index_key(run_id))  # it left the queue (started, or dropped)
        return done

    def admit(self, queue: str, run_id: str, tenant: str | None) -> str:
        """Give a resume of a run of ``queue`` a slot now, within the queue's limits (it does not wait
        among the pending submissions: a run already begun goes before new ones): ``ok`` (held by this
        worker until :meth:`release`, refreshed like a start's), or why not (``global``, ``tenant``,
        ``held``: a live slot of the run's is held, by the worker that started it until it expires)."""
        return _text(self._admit(keys=[self.base(queue)],
                                 args=[run_id, tenant or DEFAULT_TENANT, self.ttl_ms, self.owner]))

    def refresh(self, queue: str, run_ids: Iterable[str]) -> int:
        """Push the expiry of this worker's running entries ``ttl_ms`` on; returns how many it holds."""
        ids = list(run_ids)
        if not ids:
            return 0
        return int(self._refresh(keys=[self.base(queue)], args=[self.ttl_ms, self.owner, *ids]))

    # -- reading --------------------------------------------------------------------------------------

    def stats(self, queue: str) -> QueueStats:
        return stats_of(self.client, self.base(queue), queue_tag(self.group, queue))

    def flush(self, queue: str) -> int:
        """Delete every key of ``queue`` (what a lost Redis looks like; ``runlog queues rebuild`` after)."""
        keys = list(self.client.scan_iter(match=f"{_glob(self.base(queue))}:*", count=1000))
        if keys:
            self.client.delete(*keys)
        return len(keys)


def stats_of(client: Any, base: str, tag: str) -> QueueStats:
    """:class:`QueueStats` of the queue whose keys start with ``base``."""
    limits = {_text(k): _text(v) for k, v in client.hgetall(f"{base}:limits").items()}
    tenants = set(_text(t) for t in client.zrange(f"{base}:active", 0, -1))
    running = {_text(k): int(v) for k, v in client.hgetall(f"{base}:rt").items() if int(v) > 0}
    starts = {_text(k): int(v) for k, v in client.hgetall(f"{base}:starts").items()}
    pending = {t: int(client.zcard(f"{base}:p:{t}")) for t in sorted(tenants)}
    conc, per = int(limits.get("concurrency", "0")), int(limits.get("per_tenant", "0"))
    weights = {k[2:]: float(v) for k, v in limits.items() if k.startswith("w:")}
    return QueueStats(tag, conc or None, per or None, {t: n for t, n in pending.items() if n},
                      running, starts, weights, float(limits.get("default_weight", "1")))


def tags_key(prefix: str) -> str:
    """The set of every queue tag under ``prefix`` (written by ``declare`` and ``enqueue``)."""
    return f"{prefix}:queues:tags"


def all_queues(client: Any, prefix: str) -> list[QueueStats]:
    """Every queue declared or used under ``prefix`` (any App), by tag."""
    tags = sorted(_text(t) for t in client.smembers(tags_key(prefix)))
    return [stats_of(client, f"{prefix}:queues:{{{t}}}", t) for t in tags]


def waiting_runs(client: Any, prefix: str) -> list[str]:
    """Every run waiting in (or being started from) a queue under ``prefix``, any App."""
    out: list[str] = []
    for st in all_queues(client, prefix):
        out.extend(_text(r) for r in client.hkeys(f"{prefix}:queues:{{{st.tag}}}:info"))
    return out


def where_waits(client: Any, prefix: str, run_id: str) -> QueueWait | None:
    """Where and why a submitted run waits (None: no queue holds it)."""
    raw_tag = client.get(f"{prefix}:queues:at:{run_id}")
    if raw_tag is None:
        return None
    tag = _text(raw_tag)
    base = f"{prefix}:queues:{{{tag}}}"
    raw = client.hget(f"{base}:info", run_id)
    if raw is None:
        return None
    info = json.loads(raw)
    tenant, member, prio = str(info["t"]), str(info["m"]), int(info["p"])
    stats = stats_of(client, base, tag)
    if info.get("o"):
        reason = "dispatched"
    elif stats.concurrency is not None and sum(stats.running.values()) >= stats.concurrency:
        reason = "global"
    elif stats.per_tenant is not None and stats.running.get(tenant, 0) >= stats.per_tenant:
        reason = "tenant"
    else:
        reason = "turn"
    rank = client.zrank(f"{base}:p:{tenant}", member)
    return QueueWait(stats.name, stats.group, tenant, prio, reason, int(rank) if rank is not None else 0)


def _text(v: Any) -> str:
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


def _glob(s: str) -> str:
    """``s`` with Redis glob metacharacters escaped."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in s)
