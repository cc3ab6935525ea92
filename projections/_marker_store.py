"""The namespace marker and the rebuild lock a :class:`~runlog.projections.redis_store.RedisStore` holds
(its ``namespace``): which generation of the namespace a store writes under, whether the namespace is
whole (``ready``), being rebuilt (``rebuilding``, under the rebuild lock) or replayed by a new projector
group (``replaying``), and the moves between those states. Every apply is guarded by the generation: a
store whose generation the marker no longer holds is refused (:class:`ProjectionLost`)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping

import redis

from runlog.projections._marker import (
    READY,
    REBUILDING,
    REPLAYING,
    WRITABLE,
    Marker,
    marker_key,
    parse_marker,
)
from runlog.projections._sharded import ProjectionLost, ProjectionStoreError
from runlog.schemas.internal import TOKEN_EXTEND, TOKEN_RELEASE

__all__ = ["NamespaceMarker", "StandaloneClientOnClusterNode"]


class StandaloneClientOnClusterNode(ProjectionStoreError):
    """A standalone client (a ``redis://`` URL) is talking to a Redis Cluster node: the keys this node
    owns answer, every other key answers ``MOVED``. Raised when the marker is missing, so that a
    namespace whose marker happens to live on that node is not taken for a new one."""


class NamespaceMarker:
    """The marker and the rebuild lock of the namespace ``prefix`` on ``client``, and the generation
    a store writes under (its own: each store holds one)."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self._gen: str | None = None
        self._node_checked = False  # whether the server was asked if it is a cluster node
        self._extend = client.register_script(TOKEN_EXTEND)
        self._release = client.register_script(TOKEN_RELEASE)
        self._drop_marker = client.register_script(
            "if redis.call('HGET', KEYS[1], 'gen') == ARGV[1] then return redis.call('DEL', KEYS[1]) end "
            "return 0")
        self._begin_replay = client.register_script(
            "if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end "
            "redis.call('HSET', KEYS[1], 'gen', ARGV[1], 'state', ARGV[2], 'until', ARGV[3]) return 1")
        self._finish_replay = client.register_script(
            "if redis.call('HGET', KEYS[1], 'gen') == ARGV[1] "
            "and redis.call('HGET', KEYS[1], 'state') == ARGV[2] then "
            "redis.call('HSET', KEYS[1], 'state', ARGV[3]) redis.call('HDEL', KEYS[1], 'until') return 1 end "
            "return 0")

    @property
    def held(self) -> str | None:
        """The generation adopted so far, without looking the marker up (None: none yet, or void)."""
        return self._gen

    @property
    def marker_key(self) -> str:
        return marker_key(self.prefix)

    @property
    def rebuild_lock_key(self) -> str:
        return f"{self.prefix}:projection:rebuild"

    # -- the namespace marker -----------------------------------------------------------------

    def marker(self) -> Marker | None:
        """The namespace's marker, or None when there is none (a new or an emptied namespace)."""
        try:
            raw = self.client.hgetall(self.marker_key)
        except redis.RedisError as err:
            raise ProjectionStoreError(f"reading the namespace marker failed: {err}") from err
        if not raw:
            self._refuse_a_cluster_node()
        return parse_marker(raw)

    def _refuse_a_cluster_node(self) -> None:
        """Raise :class:`StandaloneClientOnClusterNode` when this is a standalone client whose server
        says ``cluster_enabled:1`` (asked once per store: only a missing marker asks)."""
        if self._node_checked or not isinstance(self.client, redis.Redis):  # a cluster client, a fake
            return
        try:
            enabled = int(self.client.info("cluster").get("cluster_enabled", 0) or 0) == 1
        except redis.RedisError:  # a server without the section, or refusing INFO: not this problem
            enabled = False
        self._node_checked = True
        if enabled:
            raise StandaloneClientOnClusterNode(
                f"namespace {self.prefix!r}: the server is a Redis Cluster node (INFO cluster: "
                "cluster_enabled:1), but the client is a standalone one (a redis:// URL), which reads "
                "only the keys this node owns")

    @property
    def generation(self) -> str:
        """The generation this store writes under; on first use, the marker's (created when there
        is none: a namespace nobody wrote yet). Raises :class:`ProjectionLost` while a rebuild runs."""
        if self._gen is None:
            try:
                pipe = self.client.pipeline(transaction=True)
                pipe.hsetnx(self.marker_key, "gen", uuid.uuid4().hex)
                pipe.hsetnx(self.marker_key, "state", READY)
                pipe.execute()
            except redis.RedisError as err:
                raise ProjectionStoreError(f"creating the namespace marker failed: {err}") from err
            m = self.marker()
            if m is None or m.state not in WRITABLE:
                raise ProjectionLost(f"namespace {self.prefix!r} is being rebuilt")
            self._gen = m.gen
        return self._gen

    def begin_replay(self, until: Mapping[int, int]) -> str | None:
        """Create the namespace's marker as ``replaying`` until the group's commits reach ``until``
        (partition -> offset), under a new generation this store adopts; None when a marker exists
        already (another member made it, or the namespace is not new)."""
        gen = uuid.uuid4().hex
        doc = json.dumps({str(p): o for p, o in sorted(until.items())})
        try:
            made = int(self._begin_replay(keys=[self.marker_key], args=[gen, REPLAYING, doc]))
        except redis.RedisError as err:
            raise ProjectionStoreError(f"creating the namespace marker failed: {err}") from err
        if not made:
            return None
        self._gen = gen
        return gen

    def replay_until(self) -> tuple[str, dict[int, int]] | None:
        """``(generation, until)`` of a ``replaying`` marker; None for any other state."""
        try:
            raw = self.client.hgetall(self.marker_key)
        except redis.RedisError as err:
            raise ProjectionStoreError(f"reading the namespace marker failed: {err}") from err
        m = parse_marker(raw)
        if m is None or m.state != REPLAYING:
            return None
        until = raw.get(b"until") or raw.get("until") or b"{}"
        doc = json.loads(until)
        return m.gen, {int(p): int(o) for p, o in doc.items()}

    def finish_replay(self, gen: str) -> bool:
        """Mark the namespace ``ready`` if it is still replaying under ``gen``."""
        try:
            return int(self._finish_replay(keys=[self.marker_key], args=[gen, REPLAYING, READY])) == 1
        except redis.RedisError as err:
            raise ProjectionStoreError(f"marking namespace {self.prefix!r} ready failed: {err}") from err

    def adopt(self, gen: str | None) -> None:
        """Write under ``gen`` from now on (None: look the marker up again on next use)."""
        self._gen = gen

    def begin_rebuild(self, holder: str, ttl_ms: int = 60_000) -> str | None:
        """Take the rebuild lock and mark the namespace ``rebuilding`` under a new generation, which
        this store adopts (every other writer's applies are refused from now on). None when another
        holder has the lock."""
        gen = uuid.uuid4().hex
        try:
            if not self.client.set(self.rebuild_lock_key, holder, nx=True, px=ttl_ms):
                return None
            self.client.hset(self.marker_key, mapping={"gen": gen, "state": REBUILDING})
        except redis.RedisError as err:
            raise ProjectionStoreError(f"starting a rebuild of {self.prefix!r} failed: {err}") from err
        self._gen = gen
        return gen

    def hold_rebuild(self, holder: str, ttl_ms: int = 60_000) -> bool:
        """Extend the rebuild lock; False when it is no longer ``holder``'s."""
        try:
            return int(self._extend(keys=[self.rebuild_lock_key], args=[holder, ttl_ms])) == 1
        except redis.RedisError as err:
            raise ProjectionStoreError(f"extending the rebuild lock failed: {err}") from err

    def rebuild_locked(self) -> bool:
        try:
            return bool(self.client.exists(self.rebuild_lock_key))
        except redis.RedisError as err:
            raise ProjectionStoreError(f"reading the rebuild lock failed: {err}") from err

    def abandon_rebuild(self, holder: str) -> None:
        """Release the rebuild lock without marking the namespace whole (a failed rebuild)."""
        try:
            self._release(keys=[self.rebuild_lock_key], args=[holder])
        except redis.RedisError as err:
            raise ProjectionStoreError(f"releasing the rebuild lock failed: {err}") from err
        self._gen = None

    def invalidate(self) -> bool:
        """Remove the namespace marker if it still holds this store's generation, so the namespace
        reads as lost and the next :func:`~runlog.projections.recovery.recover` rebuilds it from the log
        (every other writer's applies are refused from then on). False when the marker had moved
        on (another instance already invalidated, rebuilt or swapped it)."""
        gen = self._gen
        if gen is None:
            return False
        try:
            done = int(self._drop_marker(keys=[self.marker_key], args=[gen])) == 1
        except redis.RedisError as err:
            raise ProjectionStoreError(f"invalidating namespace {self.prefix!r} failed: {err}") from err
        self._gen = None
        return done

    def finish_rebuild(self, holder: str, gen: str) -> None:
        """Mark the namespace whole (``ready``) under ``gen`` and release the lock."""
        try:
            self.client.hset(self.marker_key, mapping={"gen": gen, "state": READY})
            self._release(keys=[self.rebuild_lock_key], args=[holder])
        except redis.RedisError as err:
            raise ProjectionStoreError(f"finishing the rebuild of {self.prefix!r} failed: {err}") from err


