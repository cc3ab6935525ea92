"""The count at the end of a chaos run: what the log, Redis and the demo world hold, and what is wrong.

The pure parts (:func:`lost_events`, :func:`world_duplicates`, :func:`outcomes`) take plain data so
they are tested without services; :func:`gather` reads the private services once the faults stopped.

* **effects and duplicates** from the demo world's own SQLite files: an article published twice under one
  delivery key, a card charged twice for one reference, a render billed twice for one idempotency key,
  an asset stored twice for one key.
* **lost events**: appends a worker's producer saw acknowledged (``run_id seq`` in the acks files) that
  the events topic does not hold.
* **projection differences**: the live projection (once it caught up with the log) against a rebuild of
  the log into a fresh namespace, key by key.
* **dead letters**: records on the dead-letter topic.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import redis

from runlog.projections import RedisStore, RunState, RunStatus, dump_namespace, rebuild
from runlog.projections.log_reader import read_topic
from runlog.schemas import Codec, RunEvent, Settings, Topics

__all__ = ["Count", "gather", "lost_events", "outcomes", "projection_differences", "world_duplicates",
           "world_effects"]

_DUPLICATE_QUERIES = {
    "publishes": "SELECT delivery_key, COUNT(*) FROM articles GROUP BY delivery_key HAVING COUNT(*) > 1",
    "charges": "SELECT reference, COUNT(*) FROM charges GROUP BY reference HAVING COUNT(*) > 1",
    "renders": "SELECT idempotency_key, COUNT(*) FROM bills WHERE idempotency_key IS NOT NULL"
               " GROUP BY idempotency_key HAVING COUNT(*) > 1",
    "assets": "SELECT idempotency_key, SUM(created) FROM uploads GROUP BY idempotency_key"
              " HAVING SUM(created) > 1",
}
_DB = {"publishes": "platform", "charges": "payments", "renders": "renderer", "assets": "assets"}
_EFFECT_QUERIES = {
    "publishes": ("platform", "SELECT COUNT(*) FROM articles"),
    "charges": ("payments", "SELECT COUNT(*) FROM charges"),
    "renders_billed": ("renderer", "SELECT COUNT(*) FROM bills"),
    "assets": ("assets", "SELECT COUNT(*) FROM assets"),
    "uploads": ("assets", "SELECT COUNT(*) FROM uploads"),
    "research_calls": ("search", "SELECT COUNT(*) FROM calls"),
}


@dataclass
class Count:
    """The figures a chaos run ends with (see the module's docstring)."""

    runs: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    """Run id -> why it did not complete (status and the log's last error or open effect)."""
    effects: dict[str, int] = field(default_factory=dict)
    duplicates: dict[str, list[str]] = field(default_factory=dict)
    """Kind -> the keys effected more than once (``key xN``)."""
    acked: int = 0
    events: int = 0
    lost: list[str] = field(default_factory=list)
    projection_differences: list[str] = field(default_factory=list)
    projection_behind: list[str] = field(default_factory=list)
    dead_letters: int = 0

    @property
    def duplicate_count(self) -> int:
        return sum(len(v) for v in self.duplicates.values())

    @property
    def ok(self) -> bool:
        """No duplicate, no lost event, no projection difference, no dead letter."""
        return not (self.duplicate_count or self.lost or self.projection_differences or self.projection_behind
                    or self.dead_letters)


# -- pure parts ---------------------------------------------------------------------------------


def lost_events(acked: Iterable[tuple[str, int]], logged: Iterable[tuple[str, int]]) -> list[str]:
    """Acknowledged ``(run_id, seq)`` pairs the log does not hold, as ``run_id#seq``, sorted."""
    have = set(logged)
    return sorted(f"{r}#{s}" for r, s in set(acked) - have)


def read_acks(paths: Iterable[Path]) -> list[tuple[str, int]]:
    """The ``run_id seq ...`` lines of the workers' acks files (a torn last line is skipped)."""
    out = []
    for p in paths:
        for line in p.read_text(encoding="utf-8", errors="replace").splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                out.append((parts[0], int(parts[1])))
    return out


def world_duplicates(world_dir: Path) -> dict[str, list[str]]:
    """Kind -> ``key xN`` for every key the demo world's storage holds more than once."""
    out: dict[str, list[str]] = {}
    for kind, sql in _DUPLICATE_QUERIES.items():
        with sqlite3.connect(world_dir / f"{_DB[kind]}.db") as conn:
            out[kind] = [f"{k} x{n}" for k, n in conn.execute(sql).fetchall()]
    return out


def world_effects(world_dir: Path) -> dict[str, int]:
    """What the demo world's storage holds, by kind."""
    out = {}
    for kind, (db, sql) in _EFFECT_QUERIES.items():
        with sqlite3.connect(world_dir / f"{db}.db") as conn:
            out[kind] = int(conn.execute(sql).fetchone()[0])
    return out


def _reason(s: RunState) -> str:
    parts = [s.status.value]
    if s.status is RunStatus.WAITING and s.waiting is not None:
        parts.append(f"waiting for signal {s.waiting.signal!r}")
    if s.open_effects:
        doubt = sorted(s.open_effects.items())
        parts.append("in doubt: " + ", ".join(f"{e.tool} {k[:24]}" for k, e in doubt))
    if s.last_error is not None and s.status is not RunStatus.COMPLETED:
        parts.append(f"{s.last_error.kind}: {s.last_error.message[:160]}")
    if s.stage:
        parts.append(f"at stage {s.stage}")
    return "; ".join(parts)


def outcomes(states: Mapping[str, RunState]) -> tuple[dict[str, int], dict[str, str]]:
    """(status -> runs, run id -> reason for every run that did not complete)."""
    counts = Counter(s.status.value for s in states.values())
    reasons = {r: _reason(s) for r, s in sorted(states.items()) if s.status is not RunStatus.COMPLETED}
    return dict(sorted(counts.items())), reasons


# -- reading the services -----------------------------------------------------------------------


def _log(settings: Settings, attempts: int = 5) -> list[tuple[RunEvent, int]]:
    """Every event on the events topic with its offset (retried: a read right after a restart can fail)."""
    codec = Codec(max_record_bytes=settings.max_record_bytes)
    for attempt in range(attempts):
        try:
            return [(codec.decode(m.value(), RunEvent), m.offset())
                    for batch in read_topic(settings) for m in batch]
        except Exception:
            if attempt == attempts - 1:
                raise
            time.sleep(2.0)
    raise AssertionError("unreachable")


def _dead_letters(settings: Settings) -> int:
    try:
        return sum(len(batch) for batch in read_topic(settings, topic=Topics(settings.topic_prefix).dlq))
    except Exception:  # noqa: BLE001 - no dead-letter topic: none
        return 0


def projection_differences(client: redis.Redis, settings: Settings, last_offsets: Mapping[str, int], *,
                           timeout_s: float = 120.0) -> tuple[list[str], list[str], dict[str, RunState]]:
    """Wait for the live projection to reach each run's last offset, rebuild the log into a fresh
    namespace and compare every key: (differing keys, runs the live projection never reached, the
    rebuilt states)."""
    store = RedisStore(client, settings.redis_prefix)
    deadline = time.monotonic() + timeout_s
    while True:
        states = store.load_states(last_offsets)
        behind = sorted(r for r, off in last_offsets.items() if r not in states or states[r].offset < off)
        if not behind or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    target = f"{settings.redis_prefix}.rebuilt-{uuid.uuid4().hex[:6]}"
    rebuild(settings, target, progress=None, client=client)
    try:
        rebuilt_states = RedisStore(client, target).load_states(last_offsets)
        live, rebuilt = dump_namespace(client, settings.redis_prefix), dump_namespace(client, target)
    finally:
        keys = list(client.scan_iter(match=f"{target}:*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i:i + 500])
    diffs = sorted(k for k in live.keys() | rebuilt.keys()
                   if _projection_key(k) and live.get(k) != rebuilt.get(k))
    return diffs, behind, rebuilt_states


def _projection_key(k: str) -> bool:
    return (k.endswith(("}:state", "}:checkpoints", "}:effects"))
            or k.startswith(("runs:by_status:", "{idx:")) or k == "effects:by_key")


def gather(settings: Settings, world_dir: Path, acks: Iterable[Path]) -> Count:
    """Count everything (``settings``: the harness's, straight to the broker and Redis)."""
    c = Count()
    log = _log(settings)
    c.events = len(log)
    last: dict[str, int] = {}
    for ev, off in log:
        last[ev.run_id] = max(off, last.get(ev.run_id, -1))
    acked = read_acks(acks)
    c.acked = len(set(acked))
    c.lost = lost_events(acked, ((ev.run_id, ev.seq) for ev, _ in log))
    client = redis.Redis.from_url(settings.redis_url)
    try:
        c.projection_differences, c.projection_behind, states = projection_differences(client, settings, last)
    finally:
        client.close()
    c.runs = len(states)
    c.statuses, c.reasons = outcomes(states)
    c.effects = world_effects(world_dir)
    c.duplicates = world_duplicates(world_dir)
    c.dead_letters = _dead_letters(settings)
    return c
