"""Rebuild projections from the log, compare namespaces, swap them, and fold one run's tail.

Reads use a plain confluent-kafka consumer with assigned partitions (no group
offsets are committed): every partition from the beginning (or a given
offset) up to the high watermark taken at start. Rebuild writes through the
same :class:`~projections.batch.BatchProjector` as the live projector, so a
rebuild of the same log gives the same keys, field by field.
"""

from __future__ import annotations

import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

import redis
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from projections._state import RunState, RunStatus
from projections.batch import BatchProjector, RawRecord
from projections.fold import fold
from projections.redis_store import READY, ProjectionStoreError, RedisStore
from schemas._codec import Codec
from schemas._kafka import watermarks
from schemas._redis import is_cluster, redis_client
from schemas._types import RunEvent
from schemas.errors import ConfigError, DecodeError, RunlogError
from schemas.settings import Settings
from schemas.topics import Topics

__all__ = [
    "NamespaceOverlap",
    "RebuildReport",
    "SwapFailed",
    "SwapRefused",
    "default_target",
    "diff_namespaces",
    "dump_namespace",
    "is_projection_key",
    "prefixes_overlap",
    "read_run_tail",
    "rebuild",
    "replay_into",
    "run_events",
    "swap_namespaces",
]

BATCH = 2_000


@dataclass
class RebuildReport:
    target_prefix: str
    records: int = 0
    applied: int = 0
    rejected: int = 0
    dead_letters: int = 0
    seconds: float = 0.0
    high_watermarks: dict[int, int] = field(default_factory=dict)


def _consumer(settings: Settings) -> Consumer:
    conf = settings.consumer_config(
        f"runlog-read-{uuid.uuid4().hex[:12]}",
        **{"enable.partition.eof": False, "fetch.max.bytes": 52_428_800,
           "max.partition.fetch.bytes": 10_485_760},
    )
    return Consumer(conf)


def _watermarks(c: Consumer, topic: str, timeout: float = 10.0) -> dict[int, tuple[int, int]]:
    return watermarks(c, topic, timeout=timeout)


def _read(
    c: Consumer, topic: str, starts: dict[int, int], ends: dict[int, int], poll_timeout: float = 1.0
) -> Iterator[list[Any]]:
    """Batches of messages from ``starts`` (offsets) up to ``ends`` (exclusive) on each partition."""
    todo = {p: e for p, e in ends.items() if e > starts.get(p, 0)}
    if not todo:
        return
    c.assign([TopicPartition(topic, p, starts.get(p, OFFSET_BEGINNING)) for p in todo])
    idle = 0.0
    pos = {p: max(starts.get(p, 0), 0) for p in todo}
    while todo:
        # Ask for no more than what is left, so a short tail returns as soon as it is fetched
        # instead of waiting out the poll timeout for a batch that cannot fill.
        left = sum(todo[p] - pos[p] for p in todo)
        try:
            msgs = c.consume(num_messages=max(1, min(BATCH, left)), timeout=poll_timeout)
        except KafkaException as err:
            raise RunlogError(f"consuming {topic!r} failed: {err}") from err
        if not msgs:
            _drop_finished(c, topic, todo)
            idle += poll_timeout
            if todo and idle > 60:
                raise RunlogError(f"no progress reading {topic!r} partitions {sorted(todo)}")
            continue
        idle = 0.0
        batch = []
        for m in msgs:
            kerr = m.error()
            if kerr is not None:
                if kerr.code() == KafkaError._PARTITION_EOF:
                    continue
                raise RunlogError(f"consuming {topic!r} failed: {kerr}")
            p, off = m.partition(), m.offset()
            pos[p] = max(pos.get(p, 0), off + 1)
            end = todo.get(p)
            if end is None or off >= end:
                continue
            batch.append(m)
            if off >= end - 1:
                del todo[p]
        if batch:
            yield batch
        _drop_finished(c, topic, todo)


def _drop_finished(c: Consumer, topic: str, todo: dict[int, int]) -> None:
    """Partitions whose position passed their end (control records leave offset gaps)."""
    if not todo:
        return
    for tp in c.position([TopicPartition(topic, p) for p in todo]):
        if tp.offset >= 0 and tp.offset >= todo.get(tp.partition, 0):
            todo.pop(tp.partition, None)


def _progress(out: TextIO | None, done: int, total: int, started: float) -> None:
    if out is None:
        return
    width = 30
    frac = done / total if total else 1.0
    bar = "#" * int(frac * width)
    rate = done / max(time.monotonic() - started, 1e-6)
    out.write(f"\rrebuild [{bar:<{width}}] {done}/{total} records {rate:,.0f}/s")
    out.flush()


def default_target(settings: Settings, *, swap: bool = False) -> str:
    """Where ``runlog projections rebuild`` writes without ``--target``: always under the configured
    key prefix, so a Redis ACL limited to the tenant's keys (``~<prefix>:*``) allows it.

    * a rebuild to compare (``--diff``) or inspect: ``<prefix>:rebuild``, a namespace nested inside
      the live one (its keys are ``<prefix>:rebuild:*``; the live projection's keys are compared
      apart from it, :func:`is_projection_key`);
    * a rebuild to ``--swap``: ``<prefix>.rebuild``, the sibling a swap needs (a nested namespace
      cannot be swapped). Its keys start with ``<prefix>`` but not ``<prefix>:``: with an ACL
      ``~tenant:*``, run with ``RUNLOG_REDIS_PREFIX=tenant:live`` and the sibling is
      ``tenant:live.rebuild``, inside the ACL."""
    return f"{settings.redis_prefix}.rebuild" if swap else f"{settings.redis_prefix}:rebuild"


def rebuild(
    settings: Settings,
    target_prefix: str | None = None,
    *,
    progress: TextIO | None = sys.stderr,
    client: redis.Redis | None = None,
) -> RebuildReport:
    """Replay the whole events topic into a fresh namespace ``target_prefix`` (cleared first;
    default :func:`default_target`, inside the live prefix).

    Raises :class:`NamespaceOverlap` when the target is the live prefix or holds it (clearing
    ``tenant`` would delete ``tenant:live``); a target inside the live prefix (``live:rebuild``) is
    allowed (``diff_namespaces`` tells the two apart) but cannot be swapped."""
    if target_prefix is None:
        target_prefix = default_target(settings)
    live = settings.redis_prefix
    if target_prefix == live or live.startswith(target_prefix + ":"):
        raise NamespaceOverlap(live, target_prefix, "rebuild")
    r = client or redis_client(settings)
    _delete_namespace(r, target_prefix)
    return replay_into(settings, RedisStore(r, target_prefix), progress=progress)


def replay_into(
    settings: Settings,
    store: RedisStore,
    *,
    progress: TextIO | None = None,
    on_batch: Callable[[], None] | None = None,
    from_offsets: Mapping[int, int] | None = None,
) -> RebuildReport:
    """Replay the whole events topic, up to the high watermarks taken at start, into ``store`` (not
    cleared: the offset-guarded apply skips what it already holds). ``on_batch`` runs after every
    batch (e.g. to extend a lock). ``from_offsets`` (partition -> offset) starts those partitions
    there instead of at their beginning: a catch-up of a namespace that holds everything before
    (e.g. a previous replay's ``high_watermarks``)."""
    proj = BatchProjector(store, Codec.from_settings(settings), cache_size=1 << 30)
    topic = Topics.of(settings).events
    report = RebuildReport(store.prefix)
    started = time.monotonic()
    c = _consumer(settings)
    try:
        wm = _watermarks(c, topic)
        ends = {p: hi for p, (_, hi) in wm.items()}
        report.high_watermarks = ends
        starts = {p: max(lo, (from_offsets or {}).get(p, lo)) for p, (lo, _) in wm.items()}
        total = sum(max(hi - starts[p], 0) for p, (_, hi) in wm.items())
        _progress(progress, 0, total, started)
        for msgs in _read(c, topic, starts, ends):
            recs = [RawRecord(topic, m.partition(), m.offset(), m.key(), m.value()) for m in msgs]
            res = proj.process(recs)
            report.records += len(recs)
            report.applied += res.applied
            report.rejected += sum(res.rejected.values())
            report.dead_letters += len(res.dead_letters)
            _progress(progress, report.records, total, started)
            if on_batch is not None:
                on_batch()
    finally:
        c.close()
        if progress is not None:
            progress.write("\n")
    report.seconds = time.monotonic() - started
    return report


def run_events(
    settings: Settings, run_id: str, partition: int, from_offset: int, *, codec: Codec | None = None
) -> Iterator[tuple[int, RunEvent]]:
    """One run's decodable events, with their offsets, from ``from_offset`` to the high
    watermark its partition had when the read began (records of other runs are skipped
    undecoded; undecodable ones are the projector's dead letters, not the run's story)."""
    cdc = codec or Codec.from_settings(settings)
    topic = Topics.of(settings).events
    key = run_id.encode("utf-8")
    c = _consumer(settings)
    try:
        lo, hi = watermarks(c, topic, [partition])[partition]
        for msgs in _read(c, topic, {partition: max(from_offset, lo)}, {partition: hi}):
            for m in msgs:
                if m.key() != key:
                    continue
                try:
                    ev = cdc.decode(m.value(), RunEvent)
                except DecodeError:
                    continue
                if ev.run_id == run_id:
                    yield m.offset(), ev
    finally:
        c.close()


def read_run_tail(
    settings: Settings,
    run_id: str,
    partition: int,
    from_offset: int,
    snapshot: RunState | None,
    *,
    codec: Codec | None = None,
) -> tuple[RunState | None, int]:
    """Fold one run's events from ``from_offset`` to the high watermark of its partition.

    Only records keyed by ``run_id`` are decoded; the snapshot's own position guard skips
    records it already holds (starting at a checkpoint's offset is fine).

    Returns:
        The run's state (``snapshot`` when nothing new) and how many of its events were read.
    """
    state, n = snapshot, 0
    for offset, ev in run_events(settings, run_id, partition, from_offset, codec=codec):
        state, _ = fold(state, ev, (partition, offset))
        n += 1
    return state, n


# -- namespaces -------------------------------------------------------------------------------


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


class SwapRefused(RunlogError):
    """A swap that was not started: the rebuilt namespace is not a finished rebuild, or the live
    namespace is being rebuilt by someone else (its rebuild lock is held). Nothing was changed."""


class SwapFailed(ProjectionStoreError):
    """Redis failed during a swap. ``restored`` tells whether the live namespace was put back as it
    was (and the rebuilt one too); when it was not, ``backup`` names the prefix holding the moved-out
    live keys, and the live namespace stays marked ``rebuilding`` (projectors rebuild it from the
    log once the lock expires)."""

    def __init__(self, message: str, *, restored: bool, backup: str) -> None:
        self.restored = restored
        self.backup = backup
        super().__init__(message)


def prefixes_overlap(a: str, b: str) -> bool:
    """True when the key spaces ``a:*`` and ``b:*`` overlap: ``a == b``, or one starts with the
    other followed by ``:`` (``runlog`` and ``runlog.rebuild`` do not overlap; ``t`` and ``t:r`` do)."""
    return a == b or a.startswith(b + ":") or b.startswith(a + ":")


_GLOB = re.compile(r"([\\*?\[\]])")
_RUN_KEY = re.compile(rb"\{[^}]+\}:(?:state|checkpoints|effects)")
_GLOBAL_KEYS = frozenset([b"effects:by_key", *(f"runs:by_status:{s.value}".encode() for s in RunStatus)])
#: the same indexes on Redis Cluster, one copy per shard ``{idx:<n>}`` (see projections.redis_store)
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


def _projection_keys(r: redis.Redis, prefix: str) -> list[bytes]:
    """The namespace's projection keys (:func:`is_projection_key`), full names, sorted."""
    cut = len(prefix.encode()) + 1
    return [k for k in _keys(r, prefix) if is_projection_key(k[cut:])]


def _delete_namespace(r: redis.Redis, prefix: str) -> int:
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
            keys = _projection_keys(r, prefix)
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

    When anything fails before step 5, every moved key is moved back (live and rebuilt are as they
    were) and the marker restored, then :class:`SwapFailed` is raised: the live projection is never
    left empty or half swapped by a failed swap. (When only step 5 fails, the new keys are live and
    whole; the namespace stays fenced until its lock expires and projectors rebuild it in place.)"""
    if prefixes_overlap(live, rebuilt):
        raise NamespaceOverlap(live, rebuilt, "swap")
    if is_cluster(r):  # its MULTI chunks rename keys of many slots
        raise SwapRefused("--swap is not supported on Redis Cluster yet (its renames span slots): nothing "
                          "swapped; the projectors rebuild the live namespace in place when it is lost")
    src = RedisStore(r, rebuilt)
    dst = RedisStore(r, live)
    m = src.marker()
    if m is None or m.state != READY:
        raise SwapRefused(f"namespace {rebuilt!r} is not a finished rebuild (its marker is "
                          f"{'missing' if m is None else m.state}): nothing swapped")
    token = uuid.uuid4().hex[:12]
    holder, backup = f"swap:{token}", f"{rebuilt}:swap-{token}"
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
    try:
        if catch_up is not None:
            catch_up(hold)
        cut_new, cut_old = len(rebuilt.encode()) + 1, len(live.encode()) + 1
        new = [k[cut_new:] for k in _projection_keys(r, rebuilt)]
        old = [k[cut_old:] for k in _projection_keys(r, live)]
        have = set(old)
        _move(r, [(n, n in have) for n in new], live, rebuilt, backup, chunk, hold)
        incoming = set(new)
        _move(r, [(n, True) for n in old if n not in incoming], live, None, backup, chunk, hold)
    except BaseException as err:
        restored = _roll_back(r, live, rebuilt, backup, new, old, old_marker, dst, holder)
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
        _delete_namespace(r, backup)
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


def _roll_back(r: redis.Redis, live: str, rebuilt: str, backup: str, new: list[bytes], old: list[bytes],
               old_marker: dict[Any, Any], dst: RedisStore, holder: str) -> bool:
    """Undo a failed swap from what Redis holds (whatever step failed, even with a lost reply): a
    rebuilt key that is live and no longer in ``rebuilt`` goes back, then every backed-up key
    returns to the live namespace; the marker is restored and the lock released. True when all of
    that succeeded."""
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
        pipe = r.pipeline(transaction=True)
        pipe.delete(dst.marker_key)
        if old_marker:
            pipe.hset(dst.marker_key, mapping=old_marker)
        pipe.execute()
        dst.abandon_rebuild(holder)
    except (redis.RedisError, RunlogError):
        return False
    return True
