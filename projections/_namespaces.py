"""Projection namespaces in Redis, as rebuild and swap see them: which keys under a prefix are the
projection's own (:func:`is_projection_key`; writers' keys, markers and nested namespaces are
not), when two prefixes overlap, and reading, comparing and deleting a namespace."""

from __future__ import annotations

import re
from typing import Any

import redis

from runlog.projections._state import RunStatus
from runlog.projections.redis_store import ProjectionStoreError
from runlog.schemas.errors import ConfigError

__all__ = [
    "NamespaceOverlap",
    "delete_namespace",
    "diff_namespaces",
    "dump_namespace",
    "is_projection_key",
    "prefixes_overlap",
    "projection_keys",
]


class NamespaceOverlap(ConfigError):
    """Two Redis prefixes whose key spaces overlap: they are equal, or one lies inside the other at
    a ``:`` boundary (``tenant`` and ``tenant:rebuild``), so the keys ``P:*`` of one include keys of
    the other. Rebuilding into a namespace that holds the live one, or swapping overlapping ones,
    would delete or rename live keys; use sibling prefixes (``tenant:live`` and ``tenant:rebuild``)."""

    def __init__(self, live: str, other: str, action: str) -> None:
        self.live = live
        self.other = other
        super().__init__(
            f"{action} refused: prefix {other!r} overlaps the live prefix {live!r} (one is the other "
            f"or lies inside it at a ':'); use sibling prefixes, e.g. RUNLOG_REDIS_PREFIX={live}:live "
            f"and --target {live}:rebuild")


def prefixes_overlap(a: str, b: str) -> bool:
    """True when the key spaces ``a:*`` and ``b:*`` overlap: ``a == b``, or one starts with the
    other followed by ``:`` (``runlog`` and ``runlog.rebuild`` do not overlap; ``t`` and ``t:r`` do)."""
    return a == b or a.startswith(b + ":") or b.startswith(a + ":")


_GLOB = re.compile(r"([\\*?\[\]])")
_RUN_KEY = re.compile(rb"\{[^}]+\}:(?:state|checkpoints|effects)")
_GLOBAL_KEYS = frozenset([b"effects:by_key", *(f"runs:by_status:{s.value}".encode() for s in RunStatus)])
#: the same indexes on Redis Cluster, one copy per shard ``{idx:<n>}`` (see runlog.projections.redis_store)
_SHARD_KEY = re.compile(rb"\{idx:[0-9]+\}:(effects:by_key|runs:status|runs:by_status:[A-Z_]+)")


def is_projection_key(name: bytes) -> bool:
    """Whether ``name`` (a key with its ``P:`` prefix cut off) is one the projector writes: an
    allow-list of shapes, ``{run}:state``, ``{run}:checkpoints``, ``{run}:effects``,
    ``runs:by_status:<STATUS>`` and ``effects:by_key`` (on Redis Cluster their shards
    ``{idx:<n>}:runs:by_status:<STATUS>``, ``{idx:<n>}:runs:status``, ``{idx:<n>}:effects:by_key``).
    Everything else under a prefix belongs to someone else (writers' leases, epoch counters,
    idempotency keys, effect claims, the active-runs index, the namespace marker, the keys of a
    namespace nested inside this one) and is never compared, moved or deleted by
    :func:`diff_namespaces` and :func:`swap_namespaces`."""
    return (name in _GLOBAL_KEYS or _RUN_KEY.fullmatch(name) is not None
            or _SHARD_KEY.fullmatch(name) is not None)


def _keys(r: redis.Redis, prefix: str) -> list[bytes]:
    """Every key under ``prefix`` (glob characters in the prefix are matched literally)."""
    pattern = _GLOB.sub(r"\\\1", prefix) + ":*"
    return sorted(r.scan_iter(match=pattern, count=1000))


def projection_keys(r: redis.Redis, prefix: str) -> list[bytes]:
    """The namespace's projection keys (:func:`is_projection_key`), full names, sorted."""
    cut = len(prefix.encode()) + 1
    return [k for k in _keys(r, prefix) if is_projection_key(k[cut:])]


def delete_namespace(r: redis.Redis, prefix: str) -> int:
    keys = _keys(r, prefix)
    for i in range(0, len(keys), 500):
        r.delete(*keys[i:i + 500])
    return len(keys)


def dump_namespace(r: redis.Redis, prefix: str, *, projection_only: bool = False) -> dict[str, Any]:
    """Keys under ``prefix`` (the prefix cut off) with their full values, for comparisons: every key
    but the marker and the rebuild lock (they name an incarnation, not content), or with
    ``projection_only`` only the projection keys (:func:`is_projection_key`)."""
    out: dict[str, Any] = {}
    try:
        if projection_only:
            keys = projection_keys(r, prefix)
        else:
            skip = {f"{prefix}:projection".encode(), f"{prefix}:projection:rebuild".encode()}
            keys = [k for k in _keys(r, prefix) if k not in skip]
        pipe = r.pipeline(transaction=False)
        for k in keys:
            pipe.type(k)
        types = pipe.execute()
        pipe = r.pipeline(transaction=False)
        for k, t in zip(keys, types, strict=True):
            _queue_read(pipe, k, t)
        values = pipe.execute()
    except redis.RedisError as err:
        raise ProjectionStoreError(f"reading namespace {prefix!r} failed: {err}") from err
    cut = len(prefix.encode()) + 1
    for k, t, v in zip(keys, types, values, strict=True):
        out[k[cut:].decode()] = (t.decode(), v)
    return out


def _queue_read(pipe: Any, key: bytes, kind: bytes) -> None:
    if kind == b"hash":
        pipe.hgetall(key)
    elif kind == b"zset":
        pipe.zrange(key, 0, -1, withscores=True)
    elif kind == b"set":
        pipe.smembers(key)
    elif kind == b"list":
        pipe.lrange(key, 0, -1)
    else:
        pipe.get(key)


def diff_namespaces(r: redis.Redis, live: str, other: str) -> list[str]:
    """Projection keys (prefix cut off) whose type or value differs between two namespaces, sorted.

    Only the projection's own keys are compared (:func:`is_projection_key`): writers' keys in the
    live namespace, the markers, and the keys of one namespace nested inside the other (a rebuild
    into ``live:rebuild``) are not content a rebuild reproduces. Every field of every projection key
    is compared: a live projector and a rebuild of the same log write the same values whatever their
    batch boundaries, run cache evictions or order of runs."""
    a, b = dump_namespace(r, live, projection_only=True), dump_namespace(r, other, projection_only=True)
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
