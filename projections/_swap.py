"""Swapping a rebuilt projection namespace into the live one (``runlog projections rebuild
--swap``): only projection keys move, with the live projectors fenced by the rebuild lock and the
namespace marker saying ``rebuilding``; a failed swap is rolled back from what Redis holds, so the
live projection is never left empty or half swapped. On standalone Redis the keys move in ``MULTI``
chunks; on Redis Cluster one script per slot moves that slot's keys, all or nothing
(:mod:`runlog.projections._cluster_swap`)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import redis

from runlog.projections._cluster_swap import SlotMoves, check_slots, move_slots, roll_back_slots, slot_moves
from runlog.projections._marker import READY
from runlog.projections._namespaces import (
    NamespaceOverlap,
    delete_namespace,
    prefixes_overlap,
    projection_keys,
)
from runlog.projections.redis_store import ProjectionStoreError, RedisStore
from runlog.schemas.errors import RunlogError
from runlog.schemas.internal import is_cluster

__all__ = ["SWAP_CHUNK", "SwapFailed", "SwapRefused", "swap_namespaces"]


class SwapRefused(RunlogError):
    """A swap that was not started: the rebuilt namespace is not a finished rebuild, the live
    namespace is being rebuilt by someone else (its rebuild lock is held), or, on Redis Cluster, a
    projection key has no hash tag (it cannot be moved within one slot). Nothing was changed."""


class SwapFailed(ProjectionStoreError):
    """Redis failed during a swap. ``restored`` tells whether the live namespace was put back as it
    was (and the rebuilt one too); when it was not, ``backup`` names the prefix holding the moved-out
    live keys, and the live namespace stays marked ``rebuilding`` (projectors rebuild it from the
    log once the lock expires)."""

    def __init__(self, message: str, *, restored: bool, backup: str) -> None:
        self.restored = restored
        self.backup = backup
        super().__init__(message)


SWAP_CHUNK = 200


def swap_namespaces(
    r: redis.Redis,
    live: str,
    rebuilt: str,
    *,
    catch_up: Callable[[Callable[[], None]], object] | None = None,
    lock_ttl_ms: int = 60_000,
    chunk: int = SWAP_CHUNK,
) -> int:
    """Make the projection keys of ``rebuilt`` the live ones; returns how many were moved in.

    Only projection keys move (:func:`is_projection_key`): the writers' keys in the live namespace
    (leases, epoch counters, idempotency keys, effect claims) stay, so a swap never fences a running
    run or forgets an idempotency key. The steps:

    1. refuse overlapping prefixes (:class:`NamespaceOverlap`) and a ``rebuilt`` namespace that is
       not a finished rebuild (no ``ready`` marker: :class:`SwapRefused`);
    2. fence the live projectors: take the live rebuild lock and mark the namespace ``rebuilding``
       (their applies are refused; they wait, then adopt the swapped-in generation and retry);
    3. ``catch_up(hold)`` if given: bring ``rebuilt`` up to the log's end (events the projectors
       applied after the rebuild read its high watermarks), calling ``hold`` to keep the lock;
    4. in chunks (one ``MULTI`` each): rename each live key to a backup prefix
       (``<rebuilt>:swap-<token>``) and the rebuilt key into its place, then the live keys the
       rebuild does not have to the backup;
    5. mark the live namespace ``ready`` under the rebuilt generation, release the lock, and delete
       the backup and the rebuilt marker.

    On Redis Cluster step 4 is one script per slot instead (:mod:`runlog.projections._cluster_swap`): each
    slot's renames, of both kinds, happen together or not at all; slots are not atomic together.
    A namespace with a projection key that is not one slot's under both prefixes (no hash tag) is
    refused in step 1.

    When anything fails before step 5, every moved key is moved back (live and rebuilt are as they
    were) and the marker restored, then :class:`SwapFailed` is raised: the live projection is never
    left empty or half swapped by a failed swap. (When only step 5 fails, the new keys are live and
    whole; the namespace stays fenced until its lock expires and projectors rebuild it in place.)"""
    if prefixes_overlap(live, rebuilt):
        raise NamespaceOverlap(live, rebuilt, "swap")
    src = RedisStore(r, rebuilt)
    dst = RedisStore(r, live)
    m = src.marker()
    if m is None or m.state != READY:
        raise SwapRefused(f"namespace {rebuilt!r} is not a finished rebuild (its marker is "
                          f"{'missing' if m is None else m.state}): nothing swapped")
    token = uuid.uuid4().hex[:12]
    holder, backup = f"swap:{token}", f"{rebuilt}:swap-{token}"
    cluster = is_cluster(r)
    if cluster:
        split = check_slots(r, live, rebuilt, backup)
        if split:
            raise SwapRefused(f"{len(split)} projection keys of {live!r} or {rebuilt!r} cannot be moved "
                              f"within one Redis Cluster slot, e.g. {split[0].decode()!r} (no hash tag): "
                              "nothing swapped")
    try:
        old_marker: dict[Any, Any] = dict(r.hgetall(dst.marker_key))
    except redis.RedisError as err:
        raise ProjectionStoreError(f"reading the marker of {live!r} failed: {err}") from err
    if dst.begin_rebuild(holder, lock_ttl_ms) is None:
        raise SwapRefused(f"namespace {live!r} is being rebuilt (its rebuild lock is held): nothing swapped")

    def hold() -> None:
        if not dst.hold_rebuild(holder, lock_ttl_ms):
            raise ProjectionStoreError(f"the rebuild lock of {live!r} was lost during the swap")

    new: list[bytes] = []
    old: list[bytes] = []
    slots: list[SlotMoves] = []
    try:
        if catch_up is not None:
            catch_up(hold)
        cut_new, cut_old = len(rebuilt.encode()) + 1, len(live.encode()) + 1
        new = [k[cut_new:] for k in projection_keys(r, rebuilt)]
        old = [k[cut_old:] for k in projection_keys(r, live)]
        if cluster:
            slots = slot_moves(live, rebuilt, backup, new, old)
            move_slots(r, slots, live, rebuilt, backup, chunk, hold, dst.after_writes)
        else:
            have = set(old)
            _move(r, [(n, n in have) for n in new], live, rebuilt, backup, chunk, hold)
            incoming = set(new)
            _move(r, [(n, True) for n in old if n not in incoming], live, None, backup, chunk, hold)
    except BaseException as err:
        moved_back = (roll_back_slots(r, slots, live, rebuilt, backup, chunk, dst.after_writes) if cluster
                      else _roll_back(r, live, rebuilt, backup, new, old))
        restored = moved_back and _unfence(r, dst, holder, old_marker)
        if isinstance(err, RunlogError | redis.RedisError):
            raise SwapFailed(
                f"swapping {rebuilt!r} into {live!r} failed: {err}; "
                + ("the live namespace was restored as it was" if restored else
                   f"restoring the live namespace failed too: its moved-out keys are under "
                   f"{backup!r}, and projectors rebuild it from the log once the lock expires"),
                restored=restored, backup=backup) from err
        raise
    try:  # every rebuilt key is live now: from here on, never move anything back
        dst.finish_rebuild(holder, m.gen)
    except RunlogError as err:
        raise SwapFailed(
            f"the keys of {rebuilt!r} are live in {live!r}, but marking it ready failed: {err}; the "
            f"projectors wait, then rebuild it from the log once the lock expires",
            restored=False, backup=backup) from err
    try:  # the swap is done; what is left is garbage a later rebuild of ``rebuilt`` deletes anyway
        r.delete(src.marker_key)
        delete_namespace(r, backup)
    except redis.RedisError:
        pass
    return len(new)


def _move(r: redis.Redis, names: list[tuple[bytes, bool]], live: str, rebuilt: str | None, backup: str,
          chunk: int, hold: Callable[[], None]) -> None:
    """Per name: when its flag is set, rename ``live:name`` to ``backup:name``; then, with
    ``rebuilt``, rename ``rebuilt:name`` to ``live:name``. One ``MULTI`` per chunk; any refused
    command raises."""
    lp, bp = live.encode() + b":", backup.encode() + b":"
    rp = None if rebuilt is None else rebuilt.encode() + b":"
    for i in range(0, len(names), chunk):
        pipe = r.pipeline(transaction=True)
        for name, backed in names[i:i + chunk]:
            if backed:
                pipe.rename(lp + name, bp + name)
            if rp is not None:
                pipe.rename(rp + name, lp + name)
        results = pipe.execute(raise_on_error=False)
        bad = [x for x in results if isinstance(x, Exception)]
        if bad:
            raise ProjectionStoreError(f"{len(bad)} renames refused: {bad[0]}")
        hold()


def _roll_back(r: redis.Redis, live: str, rebuilt: str, backup: str, new: list[bytes],
               old: list[bytes]) -> bool:
    """Undo a failed swap's moves from what Redis holds (whatever step failed, even with a lost
    reply): a rebuilt key that is live and no longer in ``rebuilt`` goes back, then every backed-up
    key returns to the live namespace. True when all of that succeeded."""
    lp, rp, bp = live.encode() + b":", rebuilt.encode() + b":", backup.encode() + b":"
    try:
        for i in range(0, len(new), SWAP_CHUNK):
            part = new[i:i + SWAP_CHUNK]
            pipe = r.pipeline(transaction=False)
            for n in part:
                pipe.exists(rp + n)
                pipe.exists(lp + n)
            ex = pipe.execute()
            pipe = r.pipeline(transaction=True)
            for j, n in enumerate(part):
                if not ex[2 * j] and ex[2 * j + 1]:
                    pipe.rename(lp + n, rp + n)
            pipe.execute()
        names = sorted(set(new) | set(old))
        for i in range(0, len(names), SWAP_CHUNK):
            part = names[i:i + SWAP_CHUNK]
            pipe = r.pipeline(transaction=False)
            for n in part:
                pipe.exists(bp + n)
            ex = pipe.execute()
            pipe = r.pipeline(transaction=True)
            for n, e in zip(part, ex, strict=True):
                if e:
                    pipe.rename(bp + n, lp + n)
            pipe.execute()
    except (redis.RedisError, RunlogError):
        return False
    return True


def _unfence(r: redis.Redis, dst: RedisStore, holder: str, old_marker: dict[Any, Any]) -> bool:
    """After a rolled-back swap: the live marker as it was before the swap, the lock released. True
    when both succeeded."""
    try:
        pipe = r.pipeline(transaction=True)
        pipe.delete(dst.marker_key)
        if old_marker:
            pipe.hset(dst.marker_key, mapping=old_marker)
        pipe.execute()
        dst.abandon_rebuild(holder)
    except (redis.RedisError, RunlogError):
        return False
    return True
