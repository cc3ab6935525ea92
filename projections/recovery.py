"""Make a lost projection namespace whole again, from the log, while projectors run.

Redis holds only derived state, so losing it (a restart without persistence, a
flush, a failover to an empty replica) costs a replay, never data. What must not
happen is a projector folding the middle of a run onto nothing and committing
the offsets past it. Two guards see to that:

* **While running**, every apply carries the namespace generation
  (:class:`~runlog.projections.redis_store.RedisStore`); once the marker is gone the
  script refuses and the store raises :class:`ProjectionLost`. The projector
  then calls :func:`recover`: one instance (the holder of the rebuild lock)
  replays the whole events topic into the live namespace under a new
  generation, the others wait until it is ``ready``, adopt it and retry their
  batch, which the offset guard makes a no-op where the replay already wrote.
* **At start**, :func:`lost_at_start` tells when the namespace has no marker
  although the projector's group has committed offsets: Redis was lost while no
  projector ran, so the committed offsets point past history Redis no longer
  has; the projector recovers before consuming.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from typing import TextIO

from confluent_kafka import Consumer, KafkaException, TopicPartition

from runlog.projections._marker import WRITABLE
from runlog.projections.batch import BatchProjector
from runlog.projections.rebuild import RebuildReport, replay_into
from runlog.projections.redis_store import ProjectionLost, RedisStore
from runlog.schemas.errors import RunlogError
from runlog.schemas.settings import Settings
from runlog.schemas.topics import Topics

__all__ = ["RecoveryTimeout", "lost_at_start", "recover"]

log = logging.getLogger(__name__)

LOCK_TTL_MS = 60_000


class RecoveryTimeout(RunlogError):
    """Another instance's rebuild of the namespace did not finish in time."""


def lost_at_start(settings: Settings, store: RedisStore, group_id: str) -> bool:
    """True when the namespace has no marker but ``group_id`` has committed offsets on the events
    topic (the offsets are ahead of what Redis holds)."""
    if store.marker() is not None:
        return False
    topic = Topics.of(settings).events
    c = Consumer(settings.consumer_config(group_id, **{"enable.partition.eof": False}))
    try:
        md = c.list_topics(topic, timeout=10.0).topics.get(topic)
        if md is None or md.error is not None:
            return False
        committed = c.committed([TopicPartition(topic, p) for p in md.partitions], timeout=10.0)
    except KafkaException as err:
        raise RunlogError(f"reading the committed offsets of group {group_id!r} failed: {err}") from err
    finally:
        c.close()
    return any(tp.offset >= 0 for tp in committed)


def recover(
    settings: Settings,
    store: RedisStore,
    core: BatchProjector | None = None,
    *,
    timeout_s: float = 600.0,
    progress: TextIO | None = None,
) -> RebuildReport | None:
    """Make ``store``'s namespace whole: rebuild it from the log (returns the report), or adopt the
    generation another instance rebuilt or swapped in (returns None). ``core``'s cached states are
    dropped either way. Raises :class:`RecoveryTimeout` when another rebuild does not finish within
    ``timeout_s``."""
    holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    deadline = time.monotonic() + timeout_s
    while True:
        marker = store.marker()
        if marker is not None and marker.state in WRITABLE:  # whole, or a replay that goes on
            store.adopt(marker.gen)
            if core is not None:
                core.forget()
            log.warning("projection namespace %r: adopted generation %s", store.prefix, marker.gen)
            return None
        # no marker (lost), or a rebuild whose holder died (marker rebuilding, lock expired)
        if not store.rebuild_locked():
            gen = store.begin_rebuild(holder, LOCK_TTL_MS)
            if gen is not None:
                return _rebuild(settings, store, core, holder, gen, progress)
        if time.monotonic() > deadline:
            raise RecoveryTimeout(f"the rebuild of namespace {store.prefix!r} by another instance did "
                                  f"not finish within {timeout_s:.0f}s")
        time.sleep(0.2)


def _rebuild(settings: Settings, store: RedisStore, core: BatchProjector | None, holder: str, gen: str,
             progress: TextIO | None) -> RebuildReport:
    log.warning("projection namespace %r is lost: rebuilding it from the log (generation %s)",
                store.prefix, gen)
    if core is not None:
        core.forget()

    def hold() -> None:
        if not store.hold_rebuild(holder, LOCK_TTL_MS):
            raise ProjectionLost(f"the rebuild lock of {store.prefix!r} was lost")

    try:
        report = replay_into(settings, store, progress=progress, on_batch=hold)
    except BaseException:
        store.abandon_rebuild(holder)  # another instance (or a retry) takes it from the start
        raise
    store.finish_rebuild(holder, gen)
    if core is not None:
        core.forget()
    log.warning("projection namespace %r rebuilt: %d records in %.1fs", store.prefix, report.records,
                report.seconds)
    return report
