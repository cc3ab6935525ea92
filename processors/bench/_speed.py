"""The host speed index: a fixed CPU-bound calibration, so that figures from two hosts can be compared.

The loop is the work a projector or an audit does per event, without any Runlog code (which changes
from one commit to the next, while the calibration must not): a fixed record encoded and decoded
with fastavro against a fixed schema, and the body hashed with sha256, :data:`LOOP` times. The
loop is timed :data:`REPEATS` times and the fastest repeat counts (the others were interrupted by
whatever else the host ran: the minimum is the host's speed, the rest is its load). The index is
that loop's rate over :data:`REFERENCE_LOOPS_PER_S`, so ``1.0`` is a host as fast as the reference
(the 2-core build host the performance page names) and ``0.5`` one half as fast.

Each repeat is timed by the thread's own CPU clock (:func:`time.thread_time`), not the wall clock:
on a host shared with other work the wall time of a repeat grows with the load (the thread waits
for a core), its CPU time does not, so the index measures how fast a core is, and the load average
reported beside it says how much of the host was free. On the reference host with a load average
of 9 on 2 cores, the fastest repeat of four calibrations varied by 5% (wall clock: 2x).

Goals stated against a host's capacity (the lag at 20% of the projector's own events per second)
hold on any host; absolute figures are read together with the index.
"""

from __future__ import annotations

import hashlib
import io
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import fastavro

__all__ = ["LOOP", "REFERENCE_LOOPS_PER_S", "REPEATS", "calibrate", "speed_index"]

LOOP = 500
"""Encode + decode + hash iterations per timed repeat (about 11 ms of CPU on the reference host)."""
REPEATS = 21
"""Timed repeats; the fastest counts."""
REFERENCE_LOOPS_PER_S = 89.0
"""Repeats of :data:`LOOP` per second on the reference host, i.e. ``speed_index == 1.0``."""

_SCHEMA: dict[str, Any] = {
    "type": "record", "name": "Calibration", "fields": [
        {"name": "run_id", "type": "string"},
        {"name": "seq", "type": "long"},
        {"name": "epoch", "type": "int"},
        {"name": "type", "type": {"type": "enum", "name": "Kind", "symbols": ["CALLED", "RESULT"]}},
        {"name": "tool", "type": ["null", "string"]},
        {"name": "payload_ref", "type": ["null", "string"]},
        {"name": "sha256", "type": "string"},
        {"name": "size", "type": "long"},
        {"name": "attributes", "type": {"type": "map", "values": "string"}},
        {"name": "occurred_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ]}
_RECORD: dict[str, Any] = {
    "run_id": "run-calibration-00042", "seq": 4242, "epoch": 3, "type": "RESULT", "tool": "search.query",
    "payload_ref": "file:///srv/runlog/artifacts/sha256/ab/" + "ab" * 32, "sha256": "cd" * 32,
    "size": 18_342, "attributes": {"writer": "bench", "attempt": "1", "call_id": "work/search.query/3.7"},
    "occurred_at": 1_700_000_004_242}


def _loop(n: int) -> int:
    schema = fastavro.parse_schema(_SCHEMA)
    total = 0
    for i in range(n):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, schema, _RECORD)
        body = buf.getvalue()
        rec = fastavro.schemaless_reader(io.BytesIO(body), schema, None)
        assert isinstance(rec, dict)
        total += rec["seq"] + hashlib.sha256(body + i.to_bytes(4, "big")).digest()[0]
    return total


def calibrate(*, loop: int = LOOP, repeats: int = REPEATS,
              clock: Callable[[], float] = time.thread_time) -> list[float]:
    """Seconds of each timed repeat of the loop (after one untimed warm-up repeat)."""
    _loop(max(loop // 10, 1))
    out = []
    for _ in range(repeats):
        t0 = clock()
        _loop(loop)
        out.append(clock() - t0)
    return out


def speed_index(*, loop: int = LOOP, repeats: int = REPEATS) -> dict[str, Any]:
    """The host's speed index (``index``, 1.0 = the reference host), the fastest and median repeat
    (CPU ms), and the load average when it was taken."""
    secs = calibrate(loop=loop, repeats=repeats)
    best = min(secs)
    rate = (loop / LOOP) / best if best > 0 else float("nan")
    return {"index": round(rate / REFERENCE_LOOPS_PER_S, 3), "best_ms": best * 1000,
            "median_ms": statistics.median(secs) * 1000, "loop": loop, "repeats": repeats,
            "load_avg": list(os.getloadavg())}
