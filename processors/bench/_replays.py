"""Whole-topic replays in parallel: ``runlog audit`` and ``projections rebuild`` with 1 and N workers.

Each is timed as a user sees it (wall time of the call, the workers' start included), over the
projector section's topic; the events per second of each worker count, and the speed-up of N
workers over one. The host's cores bound the speed-up: on 2 cores shared with the broker and Redis,
2 workers cannot double.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from runlog.processors.audit import AuditOptions, audit
from runlog.processors.bench._env import BenchEnv
from runlog.projections import rebuild
from runlog.schemas.settings import Settings

__all__ = ["bench_replays"]

Tick = Callable[[str], None]


def bench_replays(env: BenchEnv, settings: Settings, *, workers: Sequence[int] = (1, 2),
                  tick: Tick) -> dict[str, Any]:
    """Events/s of an audit (no artifacts, no anchors: the log alone) and of a rebuild, per worker count:
    ``events_per_s`` over the call's wall time (the workers' interpreters started included: seconds
    on a busy host, which a short topic does not amortise), ``read_events_per_s`` over the slowest
    worker's own read (with one worker, the call's)."""
    out: dict[str, Any] = {"audit": [], "rebuild": []}
    for k in workers:
        t0 = time.perf_counter()
        rep = audit(settings, AuditOptions(check_artifacts=False, anchors=False), progress=None, workers=k)
        secs = time.perf_counter() - t0
        slowest = max(rep.worker_seconds, default=secs)
        out["audit"].append({"workers": k, "events": rep.events, "seconds": secs,
                             "events_per_s": rep.events / secs if secs else 0.0,
                             "read_seconds": slowest,
                             "read_events_per_s": rep.events / slowest if slowest else 0.0,
                             "findings": len(rep.findings)})
        tick(f"audit with {k} worker(s)")
        target = f"{settings.redis_prefix}.par{k}"
        t0 = time.perf_counter()
        rb = rebuild(settings, target, progress=None, client=env.redis, workers=k)
        secs = time.perf_counter() - t0
        env.delete_keys(target + ":")
        slowest = max(rb.worker_seconds, default=secs)
        out["rebuild"].append({"workers": k, "events": rb.records, "seconds": secs,
                               "events_per_s": rb.records / secs if secs else 0.0, "read_seconds": slowest,
                               "read_events_per_s": rb.records / slowest if slowest else 0.0})
        tick(f"rebuild with {k} worker(s)")
    for kind in ("audit", "rebuild"):
        base, read = out[kind][0]["events_per_s"], out[kind][0]["read_events_per_s"]
        for p in out[kind]:
            p["speedup"] = p["events_per_s"] / base if base else 0.0
            p["read_speedup"] = p["read_events_per_s"] / read if read else 0.0
    return out
