"""Rebuild projections from the log, compare namespaces, swap them, and fold one run's tail.

Reads go through :mod:`runlog.projections.log_reader` (assigned partitions, no group
offsets committed): every partition from the beginning (or a given offset) up
to the high watermark taken at start. Rebuild writes through the
same :class:`~runlog.projections.batch.BatchProjector` as the live projector, so a
rebuild of the same log gives the same keys, field by field.

Rebuild is three modules: this one replays the log; the namespaces (which keys are the
projection's, overlaps, dumps and diffs) are :mod:`runlog.projections._namespaces`, the swap
:mod:`runlog.projections._swap`. Every name stays importable from here.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TextIO

import redis

from runlog.projections._namespaces import (
    NamespaceOverlap,
    delete_namespace,
    diff_namespaces,
    dump_namespace,
    is_projection_key,
    prefixes_overlap,
)
from runlog.projections._state import RunState
from runlog.projections._swap import SwapFailed, SwapRefused, swap_namespaces
from runlog.projections.batch import BatchProjector, RawRecord
from runlog.projections.fold import fold
from runlog.projections.log_reader import LogReader, progress_bar, read_run, read_run_records
from runlog.projections.redis_store import RedisStore
from runlog.schemas import Codec, RunEvent
from runlog.schemas.internal import redis_client
from runlog.schemas.settings import Settings

__all__ = [
    "NamespaceOverlap",
    "RebuildReport",
    "SwapFailed",
    "SwapRefused",
    "default_target",
    "diff_namespaces",
    "dump_namespace",
    "is_projection_key",
    "merge_rebuild_reports",
    "prefixes_overlap",
    "read_run_tail",
    "rebuild",
    "replay_into",
    "replay_parallel",
    "run_events",
    "swap_namespaces",
]


@dataclass
class RebuildReport:
    target_prefix: str
    records: int = 0
    applied: int = 0
    rejected: int = 0
    dead_letters: int = 0
    seconds: float = 0.0
    high_watermarks: dict[int, int] = field(default_factory=dict)
    worker_seconds: list[float] = field(default_factory=list)
    """A parallel replay's workers: how long each took to replay its partitions (its start not included)."""


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
    workers: int = 1,
) -> RebuildReport:
    """Replay the whole events topic into a fresh namespace ``target_prefix`` (cleared first;
    default :func:`default_target`, inside the live prefix).

    ``workers`` above 1 splits the topic by partition across that many processes
    (:mod:`runlog.projections._parallel`), each writing its partitions' runs into the target; the
    report sums theirs, and the namespace holds what one process would have written.

    Raises :class:`NamespaceOverlap` when the target is the live prefix or holds it (clearing
    ``tenant`` would delete ``tenant:live``); a target inside the live prefix (``live:rebuild``) is
    allowed (``diff_namespaces`` tells the two apart) but cannot be swapped."""
    if target_prefix is None:
        target_prefix = default_target(settings)
    live = settings.redis_prefix
    if target_prefix == live or live.startswith(target_prefix + ":"):
        raise NamespaceOverlap(live, target_prefix, "rebuild")
    r = client or redis_client(settings)
    delete_namespace(r, target_prefix)
    if workers > 1:
        return replay_parallel(settings, target_prefix, workers=workers, progress=progress)
    store = RedisStore(r, target_prefix, wait_replicas=settings.redis_wait_replicas,
                       wait_ms=settings.redis_wait_ms)
    return replay_into(settings, store, progress=progress)


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
    started = time.monotonic()
    with LogReader(settings) as reader, progress_bar(progress, "rebuild") as tick:
        ranges = reader.topic_ranges(from_offsets)
        report = _replay(reader, store, settings, ranges, tick, on_batch)
    report.seconds = time.monotonic() - started
    return report


@contextlib.contextmanager
def fewer_collections(gen0: int = 50_000) -> Iterator[None]:
    """The garbage collector's first threshold raised to ``gen0`` allocations while a chunk is
    folded (the process's setting, put back after). Folding allocates a state per event and the
    chunk's records are alive meanwhile: with Python's 700, the collections that walk them took a
    sixth of a rebuild's time (50 -> 42 us an event on the bench's topic). What is freed is freed by
    reference counting as before; only cycles wait a little longer. Replays on several threads of
    one process raise it once and the last puts it back; a threshold of 0 (collection off) is left."""
    global _raised
    with _GC_LOCK:
        before = gc.get_threshold()
        if _raised == 0 and before[0] != 0:  # 0: collection is off, left so
            _saved[:] = before
            gc.set_threshold(max(before[0], gen0), *before[1:])
        _raised += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _raised -= 1
            if _raised == 0 and _saved:
                gc.set_threshold(*_saved)
                _saved.clear()


_GC_LOCK = threading.Lock()
_raised = 0
"""Replays folding a chunk now (threads of one process: the threshold is the process's)."""
_saved: list[int] = []
"""The thresholds the first of them found, put back by the last."""


REPLAY_CHUNK = 20_000
"""Records a replay folds before it writes: each run the chunk touches is written once for all its
events in it (its state, new checkpoints and effects in one update), not once per fetched batch.
Measured on the bench's topic (200 runs, 100 events each), a rebuild wrote each run 10 times with
batches of 2,000 records, and the writes (the update's arguments, the snapshot's JSON, the
scripts) were half its time. About 20 MB of records at the bench's sizes."""


def _replay(reader: LogReader, store: RedisStore, settings: Settings, ranges: Mapping[int, tuple[int, int]],
            tick: Callable[[int, int], None] | None,
            on_batch: Callable[[], None] | None = None) -> RebuildReport:
    proj = BatchProjector(store, Codec.from_settings(settings), cache_size=1 << 30)
    report = RebuildReport(store.prefix)
    report.high_watermarks = {p: end for p, (_, end) in ranges.items()}
    topic = reader.topic
    chunk: list[RawRecord] = []

    def apply() -> None:
        with fewer_collections():
            res = proj.process(chunk)
        report.records += len(chunk)
        report.applied += res.applied
        report.rejected += sum(res.rejected.values())
        report.dead_letters += len(res.dead_letters)
        chunk.clear()

    for msgs in reader.batches(dict(ranges), progress=tick):
        chunk.extend([RawRecord(topic, m.partition(), m.offset(), m.key(), m.value()) for m in msgs])
        if len(chunk) >= REPLAY_CHUNK:
            apply()
        if on_batch is not None:
            on_batch()
    if chunk:
        apply()
        if on_batch is not None:
            on_batch()  # the last chunk's writes took time too: the lock is extended after them
    return report


def _replay_part(settings: Settings, partitions: list[int], arg: tuple[str, dict[int, tuple[int, int]]],
                 progress: Callable[[int, int], None]) -> RebuildReport:
    """One worker of :func:`replay_parallel`: its partitions' ranges into the target namespace."""
    prefix, ranges = arg
    t0 = time.monotonic()
    client = redis_client(settings)
    try:
        store = RedisStore(client, prefix, wait_replicas=settings.redis_wait_replicas,
                           wait_ms=settings.redis_wait_ms)
        with LogReader(settings) as reader:
            report = _replay(reader, store, settings, {p: ranges[p] for p in partitions}, progress)
        report.seconds = time.monotonic() - t0
        return report
    finally:
        client.close()


def merge_rebuild_reports(prefix: str, parts: list[RebuildReport],
                          ranges: Mapping[int, tuple[int, int]]) -> RebuildReport:
    """The workers' reports as one (counts summed, every partition's high watermark)."""
    out = RebuildReport(prefix, high_watermarks={p: end for p, (_, end) in sorted(ranges.items())},
                        worker_seconds=[p.seconds for p in parts])
    for part in parts:
        out.records += part.records
        out.applied += part.applied
        out.rejected += part.rejected
        out.dead_letters += part.dead_letters
    return out


def replay_parallel(settings: Settings, target_prefix: str, *, workers: int,
                    progress: TextIO | None = None) -> RebuildReport:
    """:func:`replay_into` a namespace ``target_prefix`` (not cleared) by ``workers`` processes, each
    replaying a share of the partitions (:func:`runlog.projections._parallel.split_partitions`) up
    to the high watermarks taken here first."""
    from runlog.projections._parallel import run_partitioned, split_partitions

    started = time.monotonic()
    with LogReader(settings) as reader:
        ranges = reader.topic_ranges()
    busy = [p for p, (lo, hi) in ranges.items() if hi > lo]
    groups = split_partitions(busy, workers)
    with progress_bar(progress, f"rebuild ({len(groups)} workers)") as tick:
        parts = run_partitioned(_replay_part, settings, groups, (target_prefix, ranges), progress=tick)
    report = merge_rebuild_reports(target_prefix, parts, ranges)
    report.seconds = time.monotonic() - started
    return report


def run_events(
    settings: Settings, run_id: str, partition: int, from_offset: int, *, codec: Codec | None = None
) -> Iterator[tuple[int, RunEvent]]:
    """One run's decodable events, with their offsets, from ``from_offset`` to the high
    watermark its partition had when the read began (records of other runs are skipped
    undecoded; undecodable ones are the projector's dead letters, not the run's story).
    :func:`runlog.projections.log_reader.read_run`."""
    return read_run(settings, run_id, partition, from_offset, codec=codec)


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
    for offset, ev, h in read_run_records(settings, run_id, partition, from_offset, codec=codec):
        state, _ = fold(state, ev, (partition, offset), content_hash=h)  # hashed from the bytes read
        n += 1
    return state, n
