"""The Redis adapter of :class:`~runlog.projections.store.ProjectionStore`.

Key layout (``P`` = ``settings.redis_prefix``; braces are literal hash tags, so
one run's keys share a Redis Cluster slot):

* ``P:{run}:state``        hash: status, stage, next_stage, last_seq, last_hash, epoch,
  partition, offset, workflow, workflow_version, updated_at, rejected, checkpoint,
  open_effects, ``snapshot`` (the RunState as JSON but its calls) and ``call:<call id>`` per
  call (``calls`` = ``apart``; :mod:`runlog.projections._layout`);
* ``P:{run}:checkpoints``  sorted set by last_seq of JSON {checkpoint, state};
* ``P:{run}:effects``      hash delivery_key -> effect JSON;
* ``P:runs:by_status:S``   sorted set of run ids by last update time (event time);
* ``P:effects:by_key``     hash delivery_key -> effect JSON (includes run_id, status and
  ``sort_key``): when runs share a delivery key, the entry with the smallest
  :attr:`~runlog.projections._state.EffectEntry.sort_key` (done beats open, then the earliest opened),
  so the live projector and a rebuild pick the same run whatever order they process runs in;
* ``P:projection``         hash: ``gen`` (a token naming this incarnation of the namespace) and
  ``state`` (``ready`` | ``rebuilding``); ``P:projection:rebuild`` the rebuild lock.

The state's ``last_seq`` and ``last_hash`` (in the snapshot too, with the seq and hash of each
recent checkpoint entry) are the run's anchors: the seq and ``runlog.schemas.event_hash`` of the last
event the fold accepted, held outside the log; ``runlog audit`` checks that the log still holds
that event at that seq. State written before hashes existed has none: no anchor.

The marker makes a lost Redis visible: every apply carries the generation the
writer claimed or adopted, and the script refuses (``LOST``) when the marker no
longer holds it (Redis restarted empty, flushed, or the namespace swapped), so
a projector never folds a run's middle onto nothing. It then rebuilds the
namespace from the log (:mod:`runlog.projections.recovery`).

Each update is one ``EVALSHA`` of ``lua/apply.lua`` (loaded once), guarded by
the run's stored log offset; a batch of updates goes through one pipeline.
On Redis Cluster the global indexes are sharded, one hash tag per shard, and an apply is two
pipelined steps: that layout and its apply are :mod:`runlog.projections._sharded` (the store's
:attr:`RedisStore.indexes`). The marker and the rebuild lock are :mod:`runlog.projections._marker_store`
(the store's :attr:`RedisStore.namespace`); a batch not yet whole is kept and sent again ahead of the
next (:mod:`runlog.projections._kept`, the store's :attr:`RedisStore.kept`).
An apply returns once its writes are on replicas (``RUNLOG_REDIS_WAIT_REPLICAS``: on a cluster by
default, on a standalone server when set to a number; :mod:`runlog.projections._replicas`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import redis

from runlog.projections._kept import KeptBatch
from runlog.projections._layout import apply_argv, state_from_hash
from runlog.projections._marker import (
    Marker,
    state_key,
)
from runlog.projections._marker_store import NamespaceMarker
from runlog.projections._replicas import ReplicaWaits
from runlog.projections._sharded import (
    LOST,
    RESULTS,
    AfterWrites,
    ProjectionLost,
    ProjectionStoreError,
    ShardedIndexes,
    lua,
    raise_failed,
)
from runlog.projections._state import (
    EffectEntry,
    RunState,
    RunStatus,
    StoredCheckpoint,
    checkpoint_from_dict,
    effect_from_dict,
    state_from_dict,
)
from runlog.projections._wire import pipeline
from runlog.projections.store import ApplyResult, RunUpdate
from runlog.schemas.internal import is_cluster, redis_client
from runlog.schemas.settings import Settings

__all__ = ["Marker", "ProjectionLost", "ProjectionStoreError", "RedisStore", "apply_script"]


def apply_script() -> str:
    """The Lua source that applies one run update."""
    return lua("apply.lua")


class RedisStore:
    """Projection store in Redis under ``prefix`` (see the module docstring; on Redis Cluster,
    :mod:`runlog.projections._sharded`).

    It holds its parts as fields: :attr:`namespace` (the marker, the rebuild lock and the generation it
    writes under), :attr:`indexes` (the index shards and the two-step apply, on a cluster) and
    :attr:`kept` (a batch not yet whole); the namespace's moves are also its own methods
    (:meth:`marker`, :meth:`begin_rebuild`, ...), which call the marker's.
    """

    def __init__(self, client: redis.Redis, prefix: str, *, wait_replicas: int | None = None,
                 wait_ms: int = 2000) -> None:
        """``wait_replicas`` and ``wait_ms``: how many replicas must hold an apply's writes before
        it returns (None: auto) and how long to wait for them (:mod:`runlog.projections._replicas`)."""
        self.client = client
        self.prefix = prefix
        self.namespace = NamespaceMarker(client, prefix)
        """The namespace marker, the rebuild lock and the generation this store writes under."""
        self.kept = KeptBatch()
        """The updates of a batch not yet whole, sent again ahead of the next apply's."""
        self._calls_inline: set[str] = set()
        """Runs loaded from a snapshot that holds their calls (the layout before calls were kept
        apart): their next write is a whole one."""
        self.cluster = is_cluster(client)
        self.waits = ReplicaWaits(client, cluster=self.cluster, replicas=wait_replicas, timeout_ms=wait_ms)
        self._after_writes = self.waits.after if self.waits.enabled else None
        self.indexes = ShardedIndexes(client, prefix, self.namespace, after_writes=self._after_writes) \
            if self.cluster else None
        """On Redis Cluster, the index shards and the two-step apply; None on a standalone server."""
        self._source = self.indexes.source if self.indexes is not None else apply_script()
        try:
            self._sha: str = str(client.script_load(self._source))
        except redis.RedisError as err:
            raise ProjectionStoreError(f"cannot load the apply script: {err}") from err

    @property
    def after_writes(self) -> AfterWrites | None:
        """What queues the replica waits of a pipeline's writes (None: this store does not wait)."""
        return self._after_writes

    @classmethod
    def from_settings(cls, settings: Settings, prefix: str | None = None) -> RedisStore:
        client = redis_client(settings)
        return cls(client, settings.redis_prefix if prefix is None else prefix,
                   wait_replicas=settings.redis_wait_replicas, wait_ms=settings.redis_wait_ms)

    # -- keys ---------------------------------------------------------------------------------

    def state_key(self, run_id: str) -> str:
        return state_key(self.prefix, run_id)

    def checkpoints_key(self, run_id: str) -> str:
        return f"{self.prefix}:{{{run_id}}}:checkpoints"

    def effects_key(self, run_id: str) -> str:
        return f"{self.prefix}:{{{run_id}}}:effects"

    def status_key(self, status: RunStatus) -> str:
        return f"{self.prefix}:runs:by_status:{status.value}"

    @property
    def effects_index_key(self) -> str:
        return f"{self.prefix}:effects:by_key"

    def status_keys(self, status: RunStatus) -> list[str]:
        """Every key holding the runs of ``status``: one, or one per shard on a cluster."""
        if self.indexes is None:
            return [self.status_key(status)]
        return self.indexes.status_keys(status)

    def effect_index_key_of(self, delivery_key: str) -> str:
        """The key whose hash holds ``delivery_key``'s indexed effect."""
        return self.effects_index_key if self.indexes is None else self.indexes.effects_key_of(delivery_key)

    # -- the namespace marker and the rebuild lock (runlog.projections._marker_store) -----------------

    @property
    def marker_key(self) -> str:
        return self.namespace.marker_key

    @property
    def rebuild_lock_key(self) -> str:
        return self.namespace.rebuild_lock_key

    @property
    def generation(self) -> str:
        """The generation this store writes under
        (:attr:`~runlog.projections._marker_store.NamespaceMarker.generation`)."""
        return self.namespace.generation

    def marker(self) -> Marker | None:
        """The namespace's marker, or None when there is none (a new or an emptied namespace)."""
        return self.namespace.marker()

    def begin_replay(self, until: Mapping[int, int]) -> str | None:
        """:meth:`~runlog.projections._marker_store.NamespaceMarker.begin_replay`."""
        return self.namespace.begin_replay(until)

    def replay_until(self) -> tuple[str, dict[int, int]] | None:
        """:meth:`~runlog.projections._marker_store.NamespaceMarker.replay_until`."""
        return self.namespace.replay_until()

    def finish_replay(self, gen: str) -> bool:
        """:meth:`~runlog.projections._marker_store.NamespaceMarker.finish_replay`."""
        return self.namespace.finish_replay(gen)

    def adopt(self, gen: str | None) -> None:
        """Write under ``gen`` from now on (None: look the marker up again on next use)."""
        self.namespace.adopt(gen)

    def begin_rebuild(self, holder: str, ttl_ms: int = 60_000) -> str | None:
        """:meth:`~runlog.projections._marker_store.NamespaceMarker.begin_rebuild`."""
        return self.namespace.begin_rebuild(holder, ttl_ms)

    def hold_rebuild(self, holder: str, ttl_ms: int = 60_000) -> bool:
        """:meth:`~runlog.projections._marker_store.NamespaceMarker.hold_rebuild`."""
        return self.namespace.hold_rebuild(holder, ttl_ms)

    def rebuild_locked(self) -> bool:
        return self.namespace.rebuild_locked()

    def abandon_rebuild(self, holder: str) -> None:
        """:meth:`~runlog.projections._marker_store.NamespaceMarker.abandon_rebuild`."""
        self.namespace.abandon_rebuild(holder)

    def invalidate(self) -> bool:
        """:meth:`~runlog.projections._marker_store.NamespaceMarker.invalidate`."""
        return self.namespace.invalidate()

    def finish_rebuild(self, holder: str, gen: str) -> None:
        """:meth:`~runlog.projections._marker_store.NamespaceMarker.finish_rebuild`."""
        self.namespace.finish_rebuild(holder, gen)

    # -- reads --------------------------------------------------------------------------------

    def count(self, status: RunStatus) -> int:
        """How many runs have ``status`` (one round trip)."""
        return self.counts([status])[status]

    def counts(self, statuses: Iterable[RunStatus] | None = None) -> dict[RunStatus, int]:
        """How many runs have each of ``statuses`` (default: every status), in one round trip."""
        wanted = list(RunStatus) if statuses is None else list(statuses)
        try:
            pipe = self.client.pipeline(transaction=False)
            for s in wanted:
                for k in self.status_keys(s):
                    pipe.zcard(k)
            raw = iter(pipe.execute())
        except redis.RedisError as err:
            raise ProjectionStoreError(f"counting runs failed: {err}") from err
        return {s: sum(int(next(raw)) for _ in self.status_keys(s)) for s in wanted}

    def load_state(self, run_id: str) -> RunState | None:
        return self.load_states([run_id]).get(run_id)

    def load_states(self, run_ids: Iterable[str]) -> dict[str, RunState]:
        ids = list(run_ids)
        if not ids:
            return {}
        try:
            pipe = self.client.pipeline(transaction=False)
            for r in ids:
                pipe.hgetall(self.state_key(r))
            raw = pipe.execute()
        except redis.RedisError as err:
            raise ProjectionStoreError(f"loading {len(ids)} run states failed: {err}") from err
        out = {}
        for r, h in zip(ids, raw, strict=True):
            loaded = state_from_hash(h)
            if loaded is None:
                continue
            out[r], inline = loaded
            if inline:  # written before calls were kept apart: its next write writes them all
                self._calls_inline.add(r)
            else:
                self._calls_inline.discard(r)
        return out

    def checkpoints(self, run_id: str, *, last: int | None = None) -> list[StoredCheckpoint]:
        start = 0 if last is None else -max(last, 1)
        try:
            raw: list[Any] = list(self.client.zrange(self.checkpoints_key(run_id), start, -1))
        except redis.RedisError as err:
            raise ProjectionStoreError(f"reading checkpoints of {run_id!r} failed: {err}") from err
        out = []
        for m in raw:
            d = json.loads(m)
            out.append(StoredCheckpoint(checkpoint_from_dict(d["checkpoint"]), state_from_dict(d["state"])))
        return out

    def effects(self, run_id: str) -> dict[str, EffectEntry]:
        try:
            raw: dict[Any, Any] = dict(self.client.hgetall(self.effects_key(run_id)))
        except redis.RedisError as err:
            raise ProjectionStoreError(f"reading effects of {run_id!r} failed: {err}") from err
        return {k.decode(): effect_from_dict(json.loads(v)) for k, v in raw.items()}

    def effect(self, delivery_key: str) -> EffectEntry | None:
        try:
            raw = self.client.hget(self.effect_index_key_of(delivery_key), delivery_key)
        except redis.RedisError as err:
            raise ProjectionStoreError(f"reading effect {delivery_key!r} failed: {err}") from err
        return None if raw is None else effect_from_dict(json.loads(raw))

    def runs(self, status: RunStatus | None = None) -> list[str]:
        statuses = list(RunStatus) if status is None else [status]
        try:
            pipe = self.client.pipeline(transaction=False)
            for s in statuses:
                for k in self.status_keys(s):
                    pipe.zrange(k, 0, -1, withscores=True)
            raw = pipe.execute()
        except redis.RedisError as err:
            raise ProjectionStoreError(f"listing runs failed: {err}") from err
        scored = sorted((score, m.decode()) for part in raw for m, score in part)
        return [r for _, r in scored]

    # -- writes -------------------------------------------------------------------------------

    def script_args(self, u: RunUpdate) -> tuple[list[str], list[str | int]]:
        """KEYS and ARGV of the apply script for one update."""
        s = u.state
        base_status = u.base_status or s.status
        keys = [
            self.state_key(s.run_id),
            self.checkpoints_key(s.run_id),
            self.effects_key(s.run_id),
        ]
        if self.indexes is None:  # on a cluster the indexes and the marker are other slots' keys
            keys += [self.status_key(base_status), self.status_key(s.status), self.effects_index_key,
                     self.marker_key]
        argv = apply_argv(u, None if s.run_id in self._calls_inline else u.base_calls)
        argv.append(self.generation)
        return keys, argv

    def apply(self, updates: Sequence[RunUpdate]) -> list[ApplyResult]:
        indexes = self.indexes
        if indexes is not None:  # the run's script, then the index shards' (runlog.projections._sharded)
            results = self.kept.apply(
                updates, lambda batch: indexes.apply(batch, [self.script_args(u) for u in batch]))
        elif self._after_writes is not None:
            results = self.kept.apply(updates, self._apply_standalone)
        else:
            results = self._apply_standalone(updates) if updates else []
        if self._calls_inline:
            for u, r in zip(updates, results, strict=True):
                if r is ApplyResult.APPLIED:
                    self._calls_inline.discard(u.run_id)
        return results

    def _apply_standalone(self, updates: Sequence[RunUpdate]) -> list[ApplyResult]:
        args = [self.script_args(u) for u in updates]
        try:
            raw = self._run(args)
            if any(isinstance(r, redis.exceptions.NoScriptError) for r in raw):
                self._sha = str(self.client.script_load(self._source))
                raw = self._run(args)
        except redis.RedisError as err:
            raise ProjectionStoreError(f"applying {len(updates)} updates failed: {err}") from err
        raise_failed(raw, "apply script")
        if any(int(r) == LOST for r in raw):
            gen = self.namespace.held
            self.namespace.adopt(None)
            raise ProjectionLost(f"namespace {self.prefix!r} no longer holds generation {gen}: Redis was "
                                 f"emptied or the namespace replaced; {sum(int(r) == LOST for r in raw)} "
                                 f"of {len(raw)} updates refused")
        return [RESULTS[int(r)] for r in raw]

    def _run(self, args: list[tuple[list[str], list[str | int]]]) -> list[Any]:
        if self._after_writes is None:  # packed by hiredis, below redis-py's pipeline (projections._wire)
            sha = self._sha
            return pipeline(self.client, [("EVALSHA", sha, len(keys), *keys, *argv) for keys, argv in args])
        pipe = self.client.pipeline(transaction=False)
        for keys, argv in args:
            pipe.evalsha(self._sha, len(keys), *keys, *argv)
        check = self._after_writes(pipe, [k[0] for k, _ in args])  # WAIT for replicas after the writes
        return check(list(pipe.execute(raise_on_error=False)))
