"""Synthetic, realistic run histories for the benchmarks, and the statistics they are summarised by (pure)."""

from __future__ import annotations

import hashlib
import math
import statistics
from collections.abc import Iterator, Sequence
from typing import Any

from runlog.schemas import ArtifactRef, EventType, ReplayPolicy, RunEvent, StageSpec, WorkflowSpec
from runlog.schemas.internal import HASH_VERSION

__all__ = [
    "CYCLE",
    "WORKFLOW",
    "event_fields",
    "history",
    "median",
    "percentile",
    "ratio",
]

WORKFLOW = WorkflowSpec("bench", "1", (StageSpec("work"), StageSpec("finish")))
"""The bench workflow: a ``work`` stage repeated (a long agent loop), then ``finish``."""

CYCLE = 100
"""Events per ``work`` cycle: STAGE_STARTED, 49 tool call/result pairs, VERIFIED (a checkpoint)."""

_HASHES = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(64)]


def event_fields(seq: int, *, cycle: int = CYCLE) -> tuple[EventType, dict[str, Any]]:
    """Type and fields of event ``seq`` of a bench run (``seq`` 1 is ``RUN_STARTED``).

    Tool results are about 400 bytes of Avro: a payload reference with a sha256, an
    idempotency key, a call id and the writer's attributes, like a real tool call.
    """
    if seq == 1:
        return EventType.RUN_STARTED, {"workflow": WORKFLOW, "input_versions": {"brief": "v1"},
                                       "attributes": {"writer": "bench"}}
    pos = (seq - 2) % cycle
    n = (seq - 2) // cycle
    if pos == 0:
        return EventType.STAGE_STARTED, {"stage": "work"}
    if pos == cycle - 1:
        return EventType.VERIFIED, {"stage": "work"}
    call = (pos + 1) // 2
    call_id = f"work/search.query/{n}.{call}"
    h = _HASHES[(seq + n) % len(_HASHES)]
    ref = ArtifactRef(f"file:///srv/runlog/artifacts/sha256/{h[:2]}/{h}", h, 18_000 + seq % 997,
                      "application/json")
    if pos % 2 == 1:
        return EventType.TOOL_CALLED, {"stage": "work", "tool": "search.query", "call_id": call_id,
                                       "replay_policy": ReplayPolicy.IDEMPOTENT, "idempotency_key": h,
                                       "payload_ref": ref, "attributes": {"writer": "bench", "attempt": "1"}}
    return EventType.TOOL_RESULT, {"stage": "work", "tool": "search.query", "call_id": call_id,
                                   "replay_policy": ReplayPolicy.IDEMPOTENT, "idempotency_key": h,
                                   "payload_ref": ref, "attributes": {"writer": "bench", "attempt": "1"}}


def history(run_id: str, first: int, last: int, *, epoch: int = 1, at: int = 1_700_000_000_000,
            cycle: int = CYCLE) -> Iterator[RunEvent]:
    """Events ``first..last`` (inclusive) of a bench run, as a writer would append them (the hash
    version writers write; no ``prev_hash``, whose value does not change the costs measured)."""
    for seq in range(first, last + 1):
        t, f = event_fields(seq, cycle=cycle)
        yield RunEvent(run_id=run_id, seq=seq, epoch=epoch, type=t, occurred_at=at + seq,
                       hash_version=HASH_VERSION, **f)


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else math.nan


def percentile(xs: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0..100) by nearest rank; NaN for no data."""
    if not xs:
        return math.nan
    s = sorted(xs)
    k = max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))
    return float(s[k])


def ratio(a: float, b: float) -> float:
    """``a / b``, NaN when ``b`` is zero or either is NaN."""
    if b == 0 or math.isnan(a) or math.isnan(b):
        return math.nan
    return a / b
