"""An open-loop throughput-latency curve for durable steps: offered load at shares of the measured maximum.

A closed loop (N workers, each starting the next run when its last one ends) slows its own offered
load when the system slows, so its latencies hide the queueing a real arrival stream meets
(coordinated omission). Here the arrivals are scheduled before the run (:func:`schedule`: evenly
spaced at the offered rate) and each one starts at its scheduled time whatever is still under way
(:func:`open_loop`); its latency is measured from the scheduled time, not from when the loop got
round to starting it, so a late start counts against the system as it would for a caller.

The job is one run of the steps section's workflow (``bench-steps@1``: eight durable calls, one
confirmed effect intent) on one AsyncRunner. Its maximum is measured first, closed loop with the
steps section's admission; its idle latency is runs one at a time. Each point then offers a share
(10% to 90%) of that maximum for a few seconds and reports the runs' latency p50/p99.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from runlog.processors.bench._env import BenchEnv
from runlog.processors.bench._events import median, percentile
from runlog.processors.bench._steps import ADMIT, CALLS_PER_RUN, async_workflow
from runlog.producers import AsyncRunner
from runlog.projections.internal import READY, marker_key

__all__ = ["SHARES", "bench_open_loop", "open_loop", "schedule"]

SHARES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
"""The curve's points, as shares of the measured maximum."""

Tick = Callable[[str], None]


def schedule(rate: float, seconds: float, start: float) -> list[float]:
    """Arrival times of an open-loop load: ``rate`` per second, evenly spaced, from ``start`` for
    ``seconds`` (the last arrival before ``start + seconds``).

    Raises:
        ValueError: ``rate`` or ``seconds`` is not positive.
    """
    if rate <= 0 or seconds <= 0:
        raise ValueError(f"an open-loop schedule needs a positive rate and duration, not {rate}/s for "
                         f"{seconds}s")
    n = int(rate * seconds)
    step = 1.0 / rate
    return [start + i * step for i in range(n)]


async def open_loop(times: Sequence[float], job: Callable[[int], Awaitable[Any]], *,
                    clock: Callable[[], float] = time.perf_counter,
                    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> dict[str, Any]:
    """Start ``job(i)`` at ``times[i]`` (by ``clock``) without waiting for earlier jobs; each job's
    latency is its end minus its *scheduled* time. Returns ``latencies_s`` (in schedule order; a job
    that raised has none: ``errors`` counts it), ``start_late_s`` (how late each start was) and
    ``seconds`` (first scheduled time to the last end)."""
    lat: list[float | None] = [None] * len(times)
    late: list[float] = []
    errors: list[str] = []

    async def one(i: int, due: float) -> None:
        try:
            await job(i)
        except Exception as err:  # noqa: BLE001 -- counted in the figures, the curve goes on
            errors.append(f"{type(err).__name__}: {err}")
            return
        lat[i] = clock() - due

    tasks = []
    for i, due in enumerate(times):
        wait = due - clock()
        if wait > 0:
            await sleep(wait)
        late.append(max(clock() - due, 0.0))
        tasks.append(asyncio.ensure_future(one(i, due)))
        await asyncio.sleep(0)  # the job starts now, not after the wait for the next arrival
    await asyncio.gather(*tasks)
    end = clock()
    return {"latencies_s": [x for x in lat if x is not None], "start_late_s": late, "errors": errors,
            "seconds": end - times[0] if times else 0.0}


async def _measure(env: BenchEnv, *, runs: int, seconds: float, idle: int, shares: Sequence[float],
                   tick: Tick) -> dict[str, Any]:
    settings = env.settings("openloop")
    env.redis.hset(marker_key(settings.redis_prefix), mapping={"gen": f"bench-{env.tag}", "state": READY})
    wf = async_workflow()
    counter = iter(range(10**9))
    async with AsyncRunner.from_settings(settings) as r:
        await r.run(wf, {"i": -1})  # warm: connections, topics' metadata

        async def job(_i: int) -> Any:
            return await r.run(wf, {"i": next(counter)})

        idle_lat = []
        for _ in range(idle):
            t0 = time.perf_counter()
            await job(0)
            idle_lat.append(time.perf_counter() - t0)
        tick("open loop: idle")
        gate = asyncio.Semaphore(ADMIT)

        async def admitted(i: int) -> Any:
            async with gate:
                return await job(i)

        t0 = time.perf_counter()
        await asyncio.gather(*(admitted(i) for i in range(runs)))
        max_rate = runs / (time.perf_counter() - t0)
        tick("open loop: maximum")
        points = []
        for share in shares:
            rate = share * max_rate
            res = await open_loop(schedule(rate, seconds, time.perf_counter() + 0.05), job)
            ms = [x * 1000 for x in res["latencies_s"]]
            late = [x * 1000 for x in res["start_late_s"]]
            points.append({"share": share, "offered_runs_per_s": rate, "runs": len(ms),
                           "achieved_runs_per_s": len(ms) / res["seconds"] if res["seconds"] else 0.0,
                           "p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99),
                           "max_ms": max(ms, default=0.0),
                           "start_late_p99_ms": percentile(late, 99), "errors": len(res["errors"])})
            tick(f"open loop: {share:.0%} of maximum")
    idle_ms = [x * 1000 for x in idle_lat]
    at70 = next((p for p in points if abs(p["share"] - 0.7) < 1e-9), None)
    idle_p99 = percentile(idle_ms, 99)
    return {"max_runs_per_s": max_rate, "max_calls_per_s": max_rate * CALLS_PER_RUN,
            "calls_per_run": CALLS_PER_RUN, "idle_p50_ms": median(idle_ms), "idle_p99_ms": idle_p99,
            "idle_runs": idle, "seconds_per_point": seconds,
            "points": points,
            "p99_over_idle_at_70_ms": (at70["p99_ms"] - idle_p99) if at70 is not None else float("nan")}


def bench_open_loop(env: BenchEnv, *, runs: int, seconds: float, idle: int = 50,
                    shares: Sequence[float] = SHARES, tick: Tick) -> dict[str, Any]:
    """The steps workflow's maximum (``runs`` runs, closed loop), idle latency (``idle`` runs one at
    a time) and the open-loop curve (``seconds`` per point at each of ``shares`` of the maximum)."""
    return asyncio.run(_measure(env, runs=runs, seconds=seconds, idle=idle, shares=shares, tick=tick))
