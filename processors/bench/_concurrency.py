"""Many concurrent runs in one process: the AsyncRunner (one loop) against the Runner (a thread per run).

Both sides run the same workflow shape: two stages, four tool calls per run whose functions wait a
seeded random 20-200 ms (``asyncio.sleep`` / ``time.sleep``), one of them an IDEMPOTENT effect tool
with its own delivery key per run, so every run appends one confirmed ``EFFECT_INTENT``.

Per side: runs/s and events/s (the events topic's high watermarks before and after); the latency of
the confirmed ``EFFECT_INTENT``, from the writer's ``produce`` of the intent to the run going on after
its acknowledgement (encode, hash, send, broker ack, wake-up of the awaiting task or thread), taken by
a :class:`~runlog.producers.log._writer.RunWriter` subclass handed to ``from_settings(writer=...)`` and read
when
the effect tool is entered, beside the same start to the delivery report (``intent_ack``); the same
latency with one run at a time (``intent_idle``, the warm-up runs); and resident memory per open
run: every run is parked once inside its first tool call (an event they all wait on) while RSS is
sampled, so the delta over the warmed-up idle process is N open runs at once (kB = 1,000 bytes).
``stall``: how late a 10 ms sleep of a watcher (a task on the loop / a thread) wakes up meanwhile.

The baseline, in the same run on the same broker: a raw confluent-kafka producer with the same
configuration (idempotent, ``acks=all``) producing one record to a topic of the same shape and
flushing until its delivery report, one at a time. ``intent_over_raw_ms`` is the p50 difference.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import gc
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer

from runlog.processors.bench._concurrency_app import (
    ADMIT,
    CALLS_PER_RUN,
    TimedWriter,
    _params,
    _Park,
    async_workflow,
    latencies,
    sync_workflow,
)
from runlog.processors.bench._env import BenchEnv, end_offsets, rss_kib
from runlog.processors.bench._events import history, percentile
from runlog.processors.bench._write import RawWriter
from runlog.producers import (
    AsyncRunner,
    Runner,
    RunResult,
)
from runlog.schemas.settings import Settings
from runlog.schemas.topics import Topics

__all__ = ["bench_async_runs", "bench_threaded_runs"]

Tick = Callable[[str], None]

def _settled_rss_kib() -> int:
    """RSS after a full collection, with freed heap handed back to the OS first (glibc ``malloc_trim``),
    so memory freed earlier in the process is not silently reused by the runs being measured."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_kib()


def log_end(settings: Settings) -> int:
    """Records on the events topic (sum of its partitions' high watermarks)."""
    topic = Topics.of(settings).events
    c = Consumer(settings.consumer_config("bench-watermarks"))
    try:
        return sum(end_offsets(c, topic).values())
    finally:
        c.close()


def raw_confirmed(env: BenchEnv, settings: Settings, samples: int) -> list[float]:
    """The baseline: ms of one raw produce + flush until its delivery report, ``samples`` times."""
    raw = RawWriter(env, settings, env.raw_topic(settings, "raw.events"))
    rec = raw.as_record(next(history("run-raw", 2, 2)))
    out: list[float] = []
    for i in range(samples):
        key = f"run-raw-{i % 50:03d}".encode()
        t0 = time.perf_counter()
        raw.produce({**rec, "seq": i + 2}, key)
        raw.producer.flush(30)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def _summary(kind: str, n: int, *, completed: int, errors: list[str], seconds: float, parked_s: float,
             events: int, writer: TimedWriter, idle_intents: list[float], raw: list[float], rss0: int,
             rss_peak: int, parked: int, lag: list[float]) -> dict[str, Any]:
    i50, r50 = percentile(writer.intent_ms, 50), percentile(raw, 50)
    return {
        "kind": kind, "runs": n, "completed": completed, "failed": len(errors),
        "error_kinds": dict(collections.Counter(e.split(":", 1)[0] for e in errors)), "errors": errors[:5],
        "seconds": seconds, "start_to_parked_s": parked_s, "runs_per_s": completed / seconds,
        "events": events, "events_per_run": events / n if n else 0.0, "events_per_s": events / seconds,
        "delivered": writer.delivered, "delivery_failed": writer.failed,
        "intent_samples": len(writer.intent_ms), "intent_p50_ms": i50,
        "intent_p99_ms": percentile(writer.intent_ms, 99),
        "intent_ack_p50_ms": percentile(writer.intent_ack_ms, 50),
        "intent_ack_p99_ms": percentile(writer.intent_ack_ms, 99),
        "intent_idle_p50_ms": percentile(idle_intents, 50),
        "intent_idle_p99_ms": percentile(idle_intents, 99),
        "idle_samples": len(idle_intents),
        "raw_p50_ms": r50, "raw_p99_ms": percentile(raw, 99), "raw_samples": len(raw),
        "intent_over_raw_ms": i50 - r50,
        "intent_idle_over_raw_ms": percentile(idle_intents, 50) - r50,
        "parked": parked, "rss_before_kib": rss0, "rss_parked_kib": rss_peak,
        # per run open at the sample: all N, unless some failed before they reached the park (their
        # remains, e.g. a stored exception's frames, are still counted: then it is an upper bound)
        "memory_per_run_kb": (rss_peak - rss0) * 1.024 / parked if parked else float("nan"),
        "producer_queue_peak": writer.queue_peak,
        "stall_p50_ms": percentile(lag, 50), "stall_p99_ms": percentile(lag, 99),
        "stall_max_ms": max(lag) if lag else float("nan"),
    }


async def _async_main(settings: Settings, n: int, lat: list[list[int]], warmup: int, admit: int,
                      writer: TimedWriter, max_connections: int, tick: Tick) -> dict[str, Any]:
    park = _Park()
    wf = async_workflow(park, writer.effect_entered)
    lag: list[float] = []
    stop = asyncio.Event()

    async def watch() -> None:
        """Loop stalls: how late a 10 ms sleep wakes up; also the producer queue's peak."""
        while not stop.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(0.01)
            lag.append(max(0.0, (time.perf_counter() - t0 - 0.01) * 1000))
            writer.queue_peak = max(writer.queue_peak, writer.queued())

    async with AsyncRunner.from_settings(settings, writer=writer, max_connections=max_connections) as r:
        for i in range(warmup):  # one at a time, no tool latency: the idle confirmed-intent latency
            await r.run(wf, _params(-1 - i, [0] * CALLS_PER_RUN))
        idle = list(writer.intent_ms)
        writer.reset()
        tick(f"async: {warmup} warm-up runs")
        ev0 = await asyncio.to_thread(log_end, settings)
        rss0 = _settled_rss_kib()
        park.arm(n, loop=True)
        assert park.aall_in is not None
        watcher = asyncio.create_task(watch())
        t0 = time.perf_counter()
        tasks: list[asyncio.Task[RunResult]] = []
        finished = 0

        def count(_: object) -> None:
            nonlocal finished
            finished += 1

        while len(tasks) < n:  # admission: at most `admit` runs on their way to the park at once
            if len(tasks) - park.parked - finished < admit:
                tasks.append(asyncio.create_task(r.run(wf, _params(len(tasks), lat[len(tasks)]))))
                tasks[-1].add_done_callback(count)
            else:
                await asyncio.sleep(0.005)
        deadline = time.perf_counter() + max(120.0, n * 0.05)
        while not park.all_in.is_set() and time.perf_counter() < deadline:
            if finished + park.parked >= n:
                break  # some runs failed before the park: sample what is there
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(park.aall_in.wait(), 0.2)
        parked_s = time.perf_counter() - t0
        gc.collect()
        rss_peak = rss_kib()
        parked = park.parked
        tick(f"async: {parked} runs parked")
        park.release()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        seconds = time.perf_counter() - t0
        stop.set()
        await watcher
    completed = sum(1 for o in outcomes if not isinstance(o, BaseException) and o.completed)
    errors = [f"{type(o).__name__}: {o}" for o in outcomes if isinstance(o, BaseException)]
    return {"completed": completed, "errors": errors, "seconds": seconds, "parked_s": parked_s, "ev0": ev0,
            "idle": idle, "rss0": rss0, "rss_peak": rss_peak, "parked": parked, "lag": lag}


def bench_async_runs(env: BenchEnv, *, runs: int, raw_samples: int, warmup: int = 20, seed: int = 7,
                     admit: int = ADMIT, max_connections: int = 256, tick: Tick) -> dict[str, Any]:
    """``runs`` concurrent runs on one asyncio loop and one :class:`~runlog.producers.AsyncRunner`."""
    settings = env.settings("async-runs")
    raw = raw_confirmed(env, settings, raw_samples)
    tick("async: raw baseline")
    writer = TimedWriter(settings)
    try:
        got = asyncio.run(_async_main(settings, runs, latencies(runs, seed), warmup, admit, writer,
                                      max_connections, tick))
    finally:
        writer.close()
    events = log_end(settings) - got["ev0"]
    tick("async: all runs done")
    out = _summary("asyncio", runs, completed=got["completed"], errors=got["errors"], seconds=got["seconds"],
                   parked_s=got["parked_s"], events=events, writer=writer, idle_intents=got["idle"], raw=raw,
                   rss0=got["rss0"], rss_peak=got["rss_peak"], parked=got["parked"], lag=got["lag"])
    out.update(admit=admit, redis_max_connections=max_connections, lease_ttl_ms=settings.lease_ttl_ms)
    return out


# -- the threaded side --------------------------------------------------------------------------


def bench_threaded_runs(env: BenchEnv, *, runs: int, raw_samples: int, warmup: int = 20, seed: int = 7,
                        admit: int = ADMIT, tick: Tick) -> dict[str, Any]:
    """``runs`` concurrent runs on the sync :class:`~runlog.producers.Runner`, one thread per run."""
    settings = env.settings("threaded-runs")
    raw = raw_confirmed(env, settings, raw_samples)
    tick("threads: raw baseline")
    lat = latencies(runs, seed)
    park = _Park()
    writer = TimedWriter(settings)
    wf = sync_workflow(park, writer.effect_entered)
    outcomes: list[Any] = [None] * runs
    lag: list[float] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            time.sleep(0.01)
            lag.append(max(0.0, (time.perf_counter() - t0 - 0.01) * 1000))
            writer.queue_peak = max(writer.queue_peak, writer.queued())

    try:
        with Runner.from_settings(settings, writer=writer) as r:
            for i in range(warmup):
                r.run(wf, _params(-1 - i, [0] * CALLS_PER_RUN))
            idle = list(writer.intent_ms)
            writer.reset()
            tick(f"threads: {warmup} warm-up runs")

            finished = [0]
            lock = threading.Lock()

            def one(i: int) -> None:
                try:
                    outcomes[i] = r.run(wf, _params(i, lat[i]))
                except BaseException as err:  # noqa: BLE001 -- reported in the figures
                    outcomes[i] = err
                with lock:
                    finished[0] += 1

            ev0 = log_end(settings)
            rss0 = _settled_rss_kib()
            park.arm(runs, loop=False)
            watcher = threading.Thread(target=watch, name="bench-watch", daemon=True)
            watcher.start()
            t0 = time.perf_counter()
            threads: list[threading.Thread] = []
            while len(threads) < runs:  # admission, as on the loop
                if len(threads) - park.parked - finished[0] < admit:
                    threads.append(threading.Thread(target=one, args=(len(threads),),
                                                    name=f"bench-run-{len(threads)}", daemon=True))
                    threads[-1].start()
                else:
                    time.sleep(0.005)
            deadline = time.perf_counter() + max(120.0, runs * 0.1)
            while not park.all_in.wait(0.2) and time.perf_counter() < deadline:
                if finished[0] + park.parked >= runs:
                    break
            parked_s = time.perf_counter() - t0
            gc.collect()
            rss_peak = rss_kib()
            parked = park.parked
            tick(f"threads: {parked} runs parked")
            park.release()
            for t in threads:
                t.join()
            seconds = time.perf_counter() - t0
            stop.set()
            watcher.join()
    finally:
        stop.set()
        park.release()
        writer.close()
    events = log_end(settings) - ev0
    tick("threads: all runs done")
    completed = sum(1 for o in outcomes if o is not None and not isinstance(o, BaseException) and o.completed)
    errors = [f"{type(o).__name__}: {o}" for o in outcomes if isinstance(o, BaseException)]
    out = _summary("threads", runs, completed=completed, errors=errors, seconds=seconds, parked_s=parked_s,
                   events=events, writer=writer, idle_intents=idle, raw=raw, rss0=rss0, rss_peak=rss_peak,
                   parked=parked, lag=lag)
    out.update(admit=admit, lease_ttl_ms=settings.lease_ttl_ms)
    return out
