"""The effects ledger's last source: the compacted effects topic, read when Redis cannot tell.

The writers' claims and the projected index live in Redis, a cache of the log. When Redis lost them
(a restart without persistence, a flush, a failover of unreplicated writes) and no ready projection
says otherwise (the namespace marker is missing or ``rebuilding``), a delivery key unknown to Redis
is not an unknown effect: the compacted effects topic, which the projector publishes *before* it
writes Redis, still holds the last entry of every effect. :class:`EffectsTopic` reads it there: the
one partition the key is on (the projector's producer partitions by the key's murmur2, as
:func:`runlog.schemas.topics.partition_for`), from where the previous read of that partition stopped to
its high watermark, remembering the last entry of each key it passed; so a process reads each record
once, however many lookups it makes while Redis is being rebuilt.

A synchronous Kafka read: the async ledger face runs it on a worker thread (a step of
:func:`runlog.producers.base._redis_io.offloaded`), so the event loop and the other runs on it go on
meanwhile.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from runlog.producers.calls._ledger import LedgerEntry
from runlog.schemas import Codec, Effect
from runlog.schemas.errors import DecodeError, RunlogError
from runlog.schemas.settings import Settings
from runlog.schemas.topics import Topics, partition_for

__all__ = ["ATTEMPTS", "EffectsTopic"]

ATTEMPTS = 4
"""Reads of the topic tried for one lookup (each with a new reader) before it raises."""
RETRY_S = 1.0
"""Seconds before the second attempt; the third waits twice as long, and so on."""


class EffectsTopic:
    """Looks delivery keys up in the compacted effects topic (a callable: key -> entry or None)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topic = Topics.of(settings).effects
        self._codec = Codec.from_settings(settings)
        self._reader: Any = None
        self._lock = threading.Lock()
        self._pos: dict[int, int] = {}
        self._partitions: int | None = None
        self._last: dict[str, LedgerEntry] = {}
        self.records_read = 0

    def __call__(self, delivery_key: str) -> LedgerEntry | None:
        """The topic's last entry for ``delivery_key``, or None. A read that fails (a broker lost
        mid-read) is tried again with a new reader, :data:`ATTEMPTS` times in all, then raises
        :class:`~runlog.schemas.errors.RunlogError`: the effect is not executed on a guess."""
        with self._lock:
            for attempt in range(1, ATTEMPTS + 1):
                try:
                    return self._lookup(delivery_key)
                except RunlogError as err:
                    self._drop_reader()
                    if attempt == ATTEMPTS:
                        raise RunlogError(f"effects ledger: the effects topic {self.topic} could not be "
                                          f"read for {delivery_key[:16]}...: {err}") from err
                    time.sleep(RETRY_S * attempt)
            raise AssertionError("unreachable")  # pragma: no cover

    def _lookup(self, delivery_key: str) -> LedgerEntry | None:
        if self._reader is None:
            from runlog.projections.log_reader import LogReader

            self._reader = LogReader(self.settings, self.topic, name="runlog-ledger-effects")
        r = self._reader
        if self._partitions is None:
            self._partitions = len(r.partitions())
        p = partition_for(delivery_key, self._partitions)
        low, high = r.watermarks([p])[p]
        start = max(self._pos.get(p, low), low)
        if high > start:
            for m in r.records({p: (start, high)}):
                self.records_read += 1
                self._remember(m)
            self._pos[p] = high
        return self._last.get(delivery_key)

    def _drop_reader(self) -> None:
        if self._reader is not None:
            with contextlib.suppress(Exception):
                self._reader.close()
            self._reader = None

    def _remember(self, m: Any) -> None:
        key = m.key()
        if key is None:
            return
        dk = key.decode("utf-8", "replace")
        if m.value() is None:  # a tombstone
            self._last.pop(dk, None)
            return
        try:
            eff = self._codec.decode(m.value(), Effect)
        except DecodeError:
            return
        self._last[dk] = LedgerEntry(dk, eff.run_id, None, eff.status, eff.external_id, None, eff.tool,
                                     source="effects_topic")

    def close(self) -> None:
        with self._lock:
            self._drop_reader()
