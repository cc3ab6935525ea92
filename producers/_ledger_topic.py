"""The effects ledger's last source: the compacted effects topic, read when Redis cannot tell.

The writers' claims and the projected index live in Redis, a cache of the log. When Redis lost them
(a restart without persistence, a flush, a failover of unreplicated writes) and no ready projection
says otherwise (the namespace marker is missing or ``rebuilding``), a delivery key unknown to Redis
is not an unknown effect: the compacted effects topic, which the projector publishes *before* it
writes Redis, still holds the last entry of every effect. :class:`EffectsTopic` reads it there: the
one partition the key is on (the projector's producer partitions by the key's murmur2, as
:func:`schemas.topics.partition_for`), from where the previous read of that partition stopped to
its high watermark, remembering the last entry of each key it passed; so a process reads each record
once, however many lookups it makes while Redis is being rebuilt.

A synchronous Kafka read: the async ledger face calls it too (it blocks the event loop for the read,
which happens only while Redis has no ready projection).
"""

from __future__ import annotations

import threading
from typing import Any

from producers._ledger import LedgerEntry
from schemas._codec import Codec
from schemas._types import Effect
from schemas.errors import DecodeError
from schemas.settings import Settings
from schemas.topics import Topics, partition_for

__all__ = ["EffectsTopic"]


class EffectsTopic:
    """Looks delivery keys up in the compacted effects topic (a callable: key -> entry or None)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topic = Topics.of(settings).effects
        self._codec = Codec.from_settings(settings)
        self._reader: Any = None
        self._lock = threading.Lock()
        self._pos: dict[int, int] = {}
        self._last: dict[str, LedgerEntry] = {}
        self.records_read = 0

    def __call__(self, delivery_key: str) -> LedgerEntry | None:
        with self._lock:
            if self._reader is None:
                from projections.log_reader import LogReader

                self._reader = LogReader(self.settings, self.topic, name="runlog-ledger-effects")
            r = self._reader
            parts = r.partitions()
            p = partition_for(delivery_key, len(parts))
            low, high = r.watermarks([p])[p]
            start = max(self._pos.get(p, low), low)
            if high > start:
                for m in r.records({p: (start, high)}):
                    self.records_read += 1
                    self._remember(m)
                self._pos[p] = high
            return self._last.get(delivery_key)

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
            if self._reader is not None:
                self._reader.close()
                self._reader = None
