"""The fleet bench: submitted runs, from a client's ``submit`` to their ``RUN_STARTED`` on a worker, at
a steady offered rate (open loop: a late submit does not delay the next one); and what counting a
model call against a shared rate limit costs, beside a raw Redis round trip.

Delivery semantics: submissions are produced idempotently with ``acks=all`` and acknowledged before
``submit`` returns; the worker's intake commits each once its run started (at least once; the
keyed start makes a redelivery start nothing twice); a projector keeps the projection, as in a
fleet, so a keyed start asks Redis whether its run exists instead of reading the log.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from runlog.processors.bench._env import BenchEnv
from runlog.processors.fleet import Client, Worker
from runlog.processors.resume import App
from runlog.producers import DictInputSource, RateLimit, StageContext, Workflow
from runlog.producers.internal import RedisLimiter
from runlog.projections.log_reader import read_topic
from runlog.schemas import Codec, DecodeError, EventType, RunEvent, now_ms
from runlog.schemas.errors import RunlogError

__all__ = ["bench_fleet", "bench_limiter"]

Tick = Callable[[str], None]
WORKFLOW = "bench-fleet"


def _app() -> App:
    wf = Workflow(WORKFLOW, "1")

    @wf.stage("answer")
    def answer(ctx: StageContext, inputs: Mapping[str, Any]) -> dict[str, Any]:
        return {"i": ctx.params["i"]}

    return App.of([wf], [], DictInputSource({}), name="bench-fleet")


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] if s else float("nan")


def _started_at(env: BenchEnv, settings: Any) -> dict[str, int]:
    """Each run's ``RUN_STARTED`` time (the writer's clock) on the events topic."""
    out: dict[str, int] = {}
    codec = Codec.from_settings(settings)
    for batch in read_topic(settings):
        for m in batch:
            try:
                ev = codec.decode(m.value(), RunEvent)
            except DecodeError:
                continue
            if ev.type is EventType.RUN_STARTED:
                out.setdefault(ev.run_id, ev.occurred_at)
    return out


def bench_fleet(env: BenchEnv, *, runs: int, rate: int, concurrency: int, tick: Tick) -> dict[str, Any]:
    """``runs`` submissions offered at ``rate`` per second to one worker of ``concurrency``: submit to
    ``RUN_STARTED`` p50 / p99 (ms), how long a ``submit`` takes, and the rate achieved."""
    s = env.settings("fleet").with_(resumer_group=f"bench-{env.tag}-fleet")
    projector = env.start_projector(s, "fleet")
    worker = Worker(s, _app(), concurrency=concurrency)
    stop = threading.Event()
    serving = threading.Thread(target=worker.serve, kwargs={"stop": stop.is_set}, daemon=True)
    serving.start()
    submitted: dict[str, int] = {}
    submit_ms: list[float] = []
    try:
        with Client(s, name="bench") as client:
            client.submit(WORKFLOW, {"i": -1}).result(timeout=120)  # warm: the group joined, a run done
            tick("fleet: worker ready")
            t0 = time.perf_counter()
            for i in range(runs):
                due = t0 + i / rate
                pause = due - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                at = now_ms()
                t = time.perf_counter()
                run = client.submit(WORKFLOW, {"i": i})
                submit_ms.append((time.perf_counter() - t) * 1000)
                submitted[run.run_id] = at
            offered_s = time.perf_counter() - t0
            for run_id in submitted:
                client.run(run_id).result(timeout=300)
            tick(f"fleet: {runs} submitted runs completed")
    finally:
        stop.set()
        serving.join(60)
        worker.close()
        env.stop(projector)
    started = _started_at(env, s)
    missing = [r for r in submitted if r not in started]
    if missing:
        raise RunlogError(f"bench: {len(missing)} submitted runs have no RUN_STARTED")
    lat = [float(started[r] - at) for r, at in submitted.items()]
    tick("fleet: measured")
    return {"runs": runs, "offered_per_s": rate, "achieved_per_s": runs / offered_s,
            "concurrency": concurrency,
            "submit_to_started_p50_ms": _pct(lat, 0.5), "submit_to_started_p99_ms": _pct(lat, 0.99),
            "submit_p50_ms": statistics.median(submit_ms), "submit_p99_ms": _pct(submit_ms, 0.99)}


def bench_limiter(env: BenchEnv, *, samples: int, tick: Tick) -> dict[str, Any]:
    """What a model call's rate limit costs: one ``take`` (the Lua script) against one raw Redis
    round trip (``GET``), interleaved in one loop; medians in microseconds and their ratio."""
    prefix = f"bench-{env.tag}-limits"
    limiter = RedisLimiter(env.redis, prefix)
    limit = RateLimit("bench:model", requests=10**9, tokens=10**12, per_s=60.0)
    take: list[float] = []
    raw: list[float] = []
    limiter.take(limit, 1)  # the script loaded
    for _ in range(samples):
        t = time.perf_counter()
        env.redis.get(f"{prefix}:raw")
        raw.append(time.perf_counter() - t)
        t = time.perf_counter()
        limiter.take(limit, 100)
        take.append(time.perf_counter() - t)
    tick("limiter: measured")
    take_us, raw_us = statistics.median(take) * 1e6, statistics.median(raw) * 1e6
    return {"samples": samples, "take_us": take_us, "raw_roundtrip_us": raw_us,
            "overhead_us": take_us, "take_over_raw_ratio": take_us / raw_us}
