"""Rebuild projections from the log, compare namespaces, swap them, and fold one run's tail.

Reads use a plain confluent-kafka consumer with assigned partitions (no group
offsets are committed): every partition from the beginning (or a given
offset) up to the high watermark taken at start. Rebuild writes through the
same :class:`~projections.batch.BatchProjector` as the live projector, so a
rebuild of the same log gives the same keys, field by field.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

import redis
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from projections._state import RunState
from projections.batch import BatchProjector, RawRecord
from projections.fold import fold
from projections.redis_store import ProjectionStoreError, RedisStore
from schemas._codec import Codec
from schemas._types import RunEvent
from schemas.errors import DecodeError, RunlogError
from schemas.settings import Settings
from schemas.topics import Topics

__all__ = [
    "RebuildReport",
    "diff_namespaces",
    "dump_namespace",
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
    try:
        md = c.list_topics(topic, timeout=timeout)
        tmd = md.topics.get(topic)
        if tmd is None or tmd.error is not None:
            raise RunlogError(f"topic {topic!r} not found")
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
                for p in tmd.partitions}
    except KafkaException as err:
        raise RunlogError(f"reading watermarks of {topic!r} failed: {err}") from err


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


def rebuild(
    settings: Settings,
    target_prefix: str,
    *,
    progress: TextIO | None = sys.stderr,
    client: redis.Redis | None = None,
) -> RebuildReport:
    """Replay the whole events topic into a fresh namespace ``target_prefix`` (cleared first)."""
    if target_prefix == settings.redis_prefix:
        raise RunlogError("rebuild into the live prefix refused: rebuild elsewhere, then --swap")
    r = client or redis.Redis.from_url(settings.redis_url, **settings.redis_kwargs())
    _delete_namespace(r, target_prefix)
    return replay_into(settings, RedisStore(r, target_prefix), progress=progress)


def replay_into(
    settings: Settings,
    store: RedisStore,
    *,
    progress: TextIO | None = None,
    on_batch: Callable[[], None] | None = None,
) -> RebuildReport:
    """Replay the whole events topic, up to the high watermarks taken at start, into ``store`` (not
    cleared: the offset-guarded apply skips what it already holds). ``on_batch`` runs after every
    batch (e.g. to extend a lock)."""
    proj = BatchProjector(store, Codec(max_record_bytes=settings.max_record_bytes), cache_size=1 << 30)
    topic = Topics.of(settings).events
    report = RebuildReport(store.prefix)
    started = time.monotonic()
    c = _consumer(settings)
    try:
        wm = _watermarks(c, topic)
        ends = {p: hi for p, (_, hi) in wm.items()}
        report.high_watermarks = ends
        total = sum(hi - lo for lo, hi in wm.values())
        _progress(progress, 0, total, started)
        for msgs in _read(c, topic, {p: lo for p, (lo, _) in wm.items()}, ends):
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
    cdc = codec or Codec(max_record_bytes=settings.max_record_bytes)
    topic = Topics.of(settings).events
    key = run_id.encode("utf-8")
    c = _consumer(settings)
    try:
        try:
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10.0)
        except KafkaException as err:
            raise RunlogError(f"reading watermarks of {topic}[{partition}] failed: {err}") from err
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


def _keys(r: redis.Redis, prefix: str) -> list[bytes]:
    return sorted(r.scan_iter(match=f"{prefix}:*", count=1000))


def _projection_keys(r: redis.Redis, prefix: str) -> list[bytes]:
    """The namespace's keys without its marker and rebuild lock (they name an incarnation, not
    content: two namespaces folded from the same log differ only there)."""
    skip = {f"{prefix}:projection".encode(), f"{prefix}:projection:rebuild".encode()}
    return [k for k in _keys(r, prefix) if k not in skip]


def _delete_namespace(r: redis.Redis, prefix: str) -> int:
    keys = _keys(r, prefix)
    for i in range(0, len(keys), 500):
        r.delete(*keys[i:i + 500])
    return len(keys)


def dump_namespace(r: redis.Redis, prefix: str) -> dict[str, Any]:
    """Every key under ``prefix`` (the prefix cut off) with its full value, for comparisons."""
    out: dict[str, Any] = {}
    try:
        keys = _projection_keys(r, prefix)
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
    cut = len(prefix) + 1
    for k, t, v in zip(keys, types, values, strict=True):
        out[k.decode()[cut:]] = (t.decode(), v)
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
    """Keys (prefix cut off) whose type or value differs between two namespaces, sorted."""
    a, b = dump_namespace(r, live), dump_namespace(r, other)
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


_PROJECTION_SUFFIXES = (b":state", b":checkpoints", b":effects")
_PROJECTION_INFIXES = (b":runs:by_status:", b":effects:by_key", b":projection")


def _is_projection_key(key: bytes) -> bool:
    """A key the projector writes (not a writer's lease, epoch counter or idempotency key)."""
    return key.endswith(_PROJECTION_SUFFIXES) or any(i in key for i in _PROJECTION_INFIXES)


def swap_namespaces(r: redis.Redis, live: str, rebuilt: str) -> int:
    """Make ``rebuilt`` the live namespace: live projection keys are dropped, rebuilt ones renamed
    (one MULTI). The writers' keys in the live namespace (leases, epoch counters, idempotency keys)
    are kept: a rebuild never fences a running run or forgets an idempotency key."""
    old, new = [k for k in _keys(r, live) if _is_projection_key(k)], _keys(r, rebuilt)
    cut = len(rebuilt) + 1
    try:
        pipe = r.pipeline(transaction=True)
        for i in range(0, len(old), 500):
            pipe.delete(*old[i:i + 500])
        for k in new:
            pipe.rename(k, f"{live}:{k.decode()[cut:]}")
        pipe.execute()
    except redis.RedisError as err:
        raise ProjectionStoreError(f"swapping {rebuilt!r} into {live!r} failed: {err}") from err
    return len(new)
