"""The Redis Cluster side of :class:`~runlog.projections.redis_store.RedisStore` (its
:attr:`~runlog.projections.redis_store.RedisStore.indexes` on a cluster): the sharded global indexes and
the two-step apply, and the runner of one script per slot that the apply and the
cluster swap (:mod:`runlog.projections._cluster_swap`) share.

On Redis Cluster (a ``redis.cluster.RedisCluster`` client, ``REDIS_URL=redis+cluster://...``)
a script touches one slot, so the layout of the global indexes differs (the run keys and the
marker do not): they are split into :data:`~runlog.schemas._redis.INDEX_SHARDS` shards, each under its
own hash tag ``{idx:<n>}`` (``n`` = :func:`~runlog.schemas._redis.index_shard` of the run id or the
delivery key):

* ``P:{idx:n}:runs:by_status:S``  sorted set of run ids, as ``P:runs:by_status:S``, for the runs
  of shard ``n``;
* ``P:{idx:n}:runs:status``       hash run id -> ``"<offset> <STATUS>"``: which log offset
  the shard indexed last, so an older or repeated write never moves a run back;
* ``P:{idx:n}:effects:by_key``    hash delivery key -> effect JSON, same winner rule as
  ``P:effects:by_key``.

An apply is then two pipelined steps: ``lua/cluster_apply.lua`` per update on the run's slot
(the same offset guard; it also refuses, ``LOST``, an update computed from a stored state that
is gone: the node owning the slot came back empty), then ``lua/cluster_index.lua`` per index
write on its shard, for updates applied or already applied; both writes are idempotent and
order-independent. A projector that died between the two steps left the run stored and its index
entries not: the next projector folds the redelivered batch to duplicates and sends the stored
state again as an index-only update (``runlog.projections.batch._refreshes``), which the run's script
answers ALREADY and the index step writes.
The marker is read before each batch (one round trip) rather than inside the run's script: a
rebuild that starts between that read and the batch's writes is still fenced by the offset
guard, not by the generation. Listings fan out over the shards.

Before an apply returns, its writes are on replicas: each pipeline ends with a ``WAIT`` per primary
it wrote to (:mod:`runlog.projections._replicas`). Until a batch is whole (both steps, and their waits),
its updates are kept and sent again, ahead of the next apply's (:mod:`runlog.projections._kept`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any, Protocol

import redis

from runlog.projections._marker import _text
from runlog.projections._state import EffectEntry, RunStatus, effect_to_dict
from runlog.projections.store import ApplyResult, RunUpdate
from runlog.schemas.errors import RunlogError
from runlog.schemas.internal import INDEX_SHARDS, index_shard

__all__ = ["LOST", "RESULTS", "AfterWrites", "Generations", "ProjectionLost", "ProjectionStoreError",
           "ScriptCall", "ShardedIndexes", "dumps", "eval_each", "index_entry", "lua", "raise_failed"]

RESULTS = {1: ApplyResult.APPLIED, 0: ApplyResult.ALREADY, -1: ApplyResult.CONFLICT}
LOST = -2

ScriptCall = tuple[list[str], list[str | int]]
"""The KEYS and ARGV of one script call."""

AfterWrites = Callable[[Any, Sequence[str]], Callable[[list[Any]], list[Any]]]
"""Queues on a pipeline, after its writes, the replica waits that writes to some keys (the first of
each call) need, and returns the check of the pipeline's answers, which raises when a wait fell
short and gives back the writes' answers
(:meth:`runlog.projections._replicas.ReplicaWaits.after`)."""


class ProjectionStoreError(RunlogError):
    """Redis refused or failed a projection read or write."""


class ProjectionLost(ProjectionStoreError):
    """The namespace this store was writing is gone or was replaced (the marker no longer holds the
    store's generation), or is being rebuilt: the writer's cached states are void. Nothing of the
    refused update was written; rebuild or adopt (:func:`runlog.projections.recovery.recover`) and retry."""


def lua(name: str) -> str:
    """The source of ``projections/lua/<name>``, each ``-- #include <file>`` line replaced by that
    file's source (the shared parts of the scripts, whose names start with ``_``: Redis runs a
    script as one text)."""
    text = resources.files("runlog.projections").joinpath("lua", name).read_text(encoding="utf-8")
    return "".join(lua(line.split()[2]) if line.startswith("-- #include ") else line
                   for line in text.splitlines(keepends=True))


def dumps(v: Any) -> str:
    return json.dumps(v, separators=(",", ":"), sort_keys=True)


def index_entry(e: EffectEntry) -> str:
    """An effect as the global index holds it: its JSON with its ``sort_key`` (the winner rule)."""
    return dumps({**effect_to_dict(e), "sort_key": e.sort_key})


def raise_failed(raw: Sequence[Any], what: str) -> None:
    """Raise the first error a pipeline answered in place (``raise_on_error=False``)."""
    for r in raw:
        if isinstance(r, Exception):
            raise ProjectionStoreError(f"{what} failed: {r}") from r


def eval_each(client: Any, source: str, args: Sequence[ScriptCall],
              after: AfterWrites | None = None) -> list[Any]:
    """EVALSHA ``source`` for each (keys, argv) in one pipeline, each call routed to the node owning
    its keys' slot; the ones a node answered NOSCRIPT (a new or failed-over node) run again after the
    script is loaded on every primary. Script errors are returned in place, not raised. (redis-py's
    cluster pipeline blocks its ``evalsha``/``eval`` methods; the raw command is routed by its keys
    like any other.) ``after``: each pipeline also waits for replicas of the nodes it wrote to,
    which raises when they fall short."""
    sha = hashlib.sha1(source.encode("utf-8")).hexdigest()
    raw = _eval_pipeline(client, sha, args, after)
    again = [i for i, r in enumerate(raw) if isinstance(r, redis.exceptions.NoScriptError)]
    if again:
        client.script_load(source)
        for i, r in zip(again, _eval_pipeline(client, sha, [args[i] for i in again], after), strict=True):
            raw[i] = r
    return raw


def _eval_pipeline(client: Any, sha: str, args: Sequence[ScriptCall], after: AfterWrites | None) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    for keys, argv in args:
        pipe.execute_command("EVALSHA", sha, len(keys), *keys, *argv)
    check = after(pipe, [keys[0] for keys, _ in args]) if after is not None else None
    raw = list(pipe.execute(raise_on_error=False))
    return check(raw) if check is not None else raw


class Generations(Protocol):
    """What the cluster apply needs of the namespace marker
    (:class:`~runlog.projections._marker_store.NamespaceMarker`): the generation the store writes under,
    the marker's key, and dropping the generation once the marker no longer holds it."""

    @property
    def generation(self) -> str: ...

    @property
    def marker_key(self) -> str: ...

    def adopt(self, gen: str | None) -> None: ...


class ShardedIndexes:
    """The index shards of the namespace ``prefix`` on the cluster ``client`` and the two-step apply
    (see the module docstring).

    Args:
        client: the Redis Cluster client.
        prefix: the namespace.
        namespace: the store's generation and marker (a lost one is dropped there).
        after_writes: queues the replica waits of a pipeline's writes; None: no waits.
    """

    def __init__(self, client: Any, prefix: str, namespace: Generations, *,
                 after_writes: AfterWrites | None = None) -> None:
        self.client = client
        self.prefix = prefix
        self.namespace = namespace
        self.after_writes = after_writes
        self.source = lua("cluster_apply.lua")
        """The run's script (one slot: the run's keys)."""
        self.index_source = lua("cluster_index.lua")
        """The index script (one slot: a shard's keys)."""

    def shard_status_key(self, shard: int, status: RunStatus) -> str:
        return f"{self.prefix}:{{idx:{shard}}}:runs:by_status:{status.value}"

    def shard_status_hash(self, shard: int) -> str:
        return f"{self.prefix}:{{idx:{shard}}}:runs:status"

    def shard_effects_key(self, shard: int) -> str:
        return f"{self.prefix}:{{idx:{shard}}}:effects:by_key"

    def status_keys(self, status: RunStatus) -> list[str]:
        """The keys holding the runs of ``status``, one per shard."""
        return [self.shard_status_key(n, status) for n in range(INDEX_SHARDS)]

    def effects_key_of(self, delivery_key: str) -> str:
        """The shard's key whose hash holds ``delivery_key``'s indexed effect."""
        return self.shard_effects_key(index_shard(delivery_key))

    def apply(self, updates: Sequence[RunUpdate], args: Sequence[ScriptCall]) -> list[ApplyResult]:
        """Apply ``updates``, whose run scripts' KEYS and ARGV are ``args`` (computed under the
        namespace's generation), then write their index entries."""
        gen = self.namespace.generation
        try:
            held = self.client.hget(self.namespace.marker_key, "gen")
            if held is None or _text(held) != gen:
                self.namespace.adopt(None)
                raise ProjectionLost(f"namespace {self.prefix!r} no longer holds generation {gen}: Redis was "
                                     f"emptied or the namespace replaced; {len(updates)} updates refused")
            raw = eval_each(self.client, self.source, args, self.after_writes)
        except (redis.RedisError, redis.exceptions.RedisClusterException) as err:
            raise ProjectionStoreError(f"applying {len(updates)} updates failed: {err}") from err
        raise_failed(raw, "apply script")
        if any(int(r) == LOST for r in raw):
            self.namespace.adopt(None)
            lost = sum(int(r) == LOST for r in raw)
            raise ProjectionLost(f"namespace {self.prefix!r} lost run states under generation {gen}: a "
                                 f"node came back empty; {lost} of {len(raw)} updates refused")
        statuses = list(RunStatus)
        index: list[ScriptCall] = []
        for u, r in zip(updates, raw, strict=True):
            if RESULTS[int(r)] is ApplyResult.CONFLICT:
                continue
            s = u.state
            shard = index_shard(s.run_id)
            keys = [self.shard_status_hash(shard), *(self.shard_status_key(shard, x) for x in statuses)]
            index.append((keys, ["status", s.run_id, s.offset, s.status.value, s.updated_at,
                                 *(x.value for x in statuses)]))
            for e in u.effects:
                index.append(([self.shard_effects_key(index_shard(e.delivery_key))],
                              ["effect", e.delivery_key, index_entry(e), e.sort_key]))
        if index:
            try:
                done = eval_each(self.client, self.index_source, index, self.after_writes)
            except (redis.RedisError, redis.exceptions.RedisClusterException) as err:
                raise ProjectionStoreError(f"indexing {len(updates)} updates failed: {err}") from err
            raise_failed(done, "index script")
        return [RESULTS[int(r)] for r in raw]
