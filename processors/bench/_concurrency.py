"""Many concurrent runs in one process: the AsyncRunner (one loop) against the Runner (a thread per run).

Both sides run the same workflow shape: two stages, four tool calls per run whose functions wait a
seeded random 20-200 ms (``asyncio.sleep`` / ``time.sleep``), one of them an IDEMPOTENT effect tool
with its own delivery key per run, so every run appends one confirmed ``EFFECT_INTENT``.

Per side: runs/s and events/s (the events topic's high watermarks before and after); the latency of
the confirmed ``EFFECT_INTENT``, from the writer's ``produce`` of the intent to the run going on after
its acknowledgement (encode, hash, send, broker ack, wake-up of the awaiting task or thread), taken by
a :class:`~producers._writer.RunWriter` subclass handed to ``from_settings(writer=...)`` and read when
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
import contextvars
import ctypes
import gc
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from processors.bench._env import BenchEnv, rss_kib
from processors.bench._events import history, percentile
from processors.bench._write import RawWriter
from producers import (
    AsyncRunner,
    AsyncStageContext,
    CallInfo,
    ReplayPolicy,
    Runner,
    RunResult,
    StageContext,
    Workflow,
    tool,
)
from producers._log import DeliveryCallback
from producers._writer import RunWriter
from schemas._types import EventType, RunEvent
from schemas.errors import DeliveryError
from schemas.settings import Settings
from schemas.topics import Topics

__all__ = ["TimedWriter", "bench_async_runs", "bench_threaded_runs", "latencies"]

Tick = Callable[[str], None]

CALLS_PER_RUN = 4
"""search and fetch (stage ``research``), post (the effect) and notify (stage ``publish``)."""

ADMIT = 256
"""At most this many runs are on their way to the park at once (started, not yet parked or ended), as a
worker taking runs off a queue would admit them: every run is still open at the same time at the park,
but 10,000 runs started in the same instant would only measure a start storm."""

_INTENT_T0: contextvars.ContextVar[float | None] = contextvars.ContextVar("bench_intent_t0", default=None)
"""When the writer was handed the current run's EFFECT_INTENT (per task / per thread)."""


class TimedWriter(RunWriter):
    """The run writer, counting delivery reports and timing every confirmed ``EFFECT_INTENT``.

    ``intent_ms``: from the writer's ``produce`` of the intent to the run going on after its
    acknowledgement, i.e. entering the effect tool (:meth:`effect_entered`, called first thing in the
    tool: between the awaited append and the tool function the protocol does no I/O and never yields
    to the loop). ``intent_ack_ms``: from the same ``produce`` to the delivery report (the broker's
    acknowledgement, as the thread serving reports sees it).
    """

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.intent_ms: list[float] = []
        self.intent_ack_ms: list[float] = []
        self.delivered = 0
        self.failed = 0
        self.queue_peak = 0
        self._count_lock = threading.Lock()

    def produce(self, event: RunEvent, on_delivery: DeliveryCallback) -> None:
        t0 = time.perf_counter() if event.type is EventType.EFFECT_INTENT else None
        _INTENT_T0.set(t0)  # this task's (thread's) context: the effect tool reads it

        def cb(err: DeliveryError | None, partition: int, offset: int) -> None:
            with self._count_lock:
                if err is None:
                    self.delivered += 1
                else:
                    self.failed += 1
                if t0 is not None and err is None:
                    self.intent_ack_ms.append((time.perf_counter() - t0) * 1000)
            on_delivery(err, partition, offset)

        super().produce(event, cb)

    def effect_entered(self) -> None:
        """The effect tool was entered: its run's intent is acknowledged (the protocol awaited it)."""
        t0 = _INTENT_T0.get()
        _INTENT_T0.set(None)
        if t0 is not None:
            ms = (time.perf_counter() - t0) * 1000
            with self._count_lock:
                self.intent_ms.append(ms)

    def queued(self) -> int:
        """Records in the producer's local queue now (produced, not yet acknowledged)."""
        return len(self._producer)

    def reset(self) -> None:
        """Start counting afresh (after the warm-up runs)."""
        with self._count_lock:
            self.intent_ms, self.intent_ack_ms = [], []
            self.delivered = self.failed = 0


def _settled_rss_kib() -> int:
    """RSS after a full collection, with freed heap handed back to the OS first (glibc ``malloc_trim``),
    so memory freed earlier in the process is not silently reused by the runs being measured."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_kib()


def latencies(n: int, seed: int) -> list[list[int]]:
    """Each run's four tool latencies in ms, uniform in 20..200 (seeded: both sides get the same)."""
    rng = random.Random(seed)
    return [[rng.randint(20, 200) for _ in range(CALLS_PER_RUN)] for _ in range(n)]


def _delivery(args: Mapping[str, Any], call: CallInfo) -> tuple[str, str, str, str]:
    return ("bench", "sink", call.run_id, "1")  # one delivery key per run: never reused, always executed


class _Park:
    """Where every run waits once (inside its first tool call) while memory is sampled."""

    def __init__(self) -> None:
        self.expected = 0
        self.parked = 0
        self._lock = threading.Lock()
        self.all_in = threading.Event()
        self.go = threading.Event()
        self.go.set()  # open until armed
        self.aall_in: asyncio.Event | None = None
        self.ago: asyncio.Event | None = None

    def arm(self, n: int, *, loop: bool) -> None:
        self.expected, self.parked = n, 0
        self.all_in.clear()
        self.go.clear()
        if loop:
            self.aall_in, self.ago = asyncio.Event(), asyncio.Event()

    def _arrive(self) -> bool:
        with self._lock:
            if self.go.is_set():
                return False
            self.parked += 1
            full = self.parked >= self.expected
        if full:
            self.all_in.set()
        return True

    async def await_here(self) -> None:
        if self._arrive():
            assert self.aall_in is not None and self.ago is not None
            if self.all_in.is_set():
                self.aall_in.set()
            await self.ago.wait()

    def wait_here(self) -> None:
        if self._arrive():
            self.go.wait()

    def release(self) -> None:
        self.go.set()
        if self.ago is not None:
            self.ago.set()


def async_workflow(park: _Park, entered: Callable[[], None]) -> Workflow:
    """``bench-async@1``: research (search, fetch), publish (post: the effect, notify); all ``async def``."""

    @tool("bench.search", policy=ReplayPolicy.SAFE)
    async def search(call: CallInfo, q: str, ms: int) -> dict[str, Any]:
        await park.await_here()
        await asyncio.sleep(ms / 1000)
        return {"q": q, "hits": [f"{q}/{k}" for k in range(3)]}

    @tool("bench.fetch", policy=ReplayPolicy.IDEMPOTENT)
    async def fetch(call: CallInfo, url: str, ms: int) -> dict[str, Any]:
        await asyncio.sleep(ms / 1000)
        return {"url": url, "words": 120 + len(url)}

    @tool("bench.post", policy=ReplayPolicy.IDEMPOTENT, effect=True, target="sink:posts", delivery=_delivery)
    async def post(call: CallInfo, title: str, ms: int) -> dict[str, Any]:
        entered()
        await asyncio.sleep(ms / 1000)
        return {"external_id": f"post-{call.run_id}", "title": title}

    @tool("bench.notify", policy=ReplayPolicy.SAFE)
    async def notify(call: CallInfo, post_id: str, ms: int) -> dict[str, Any]:
        await asyncio.sleep(ms / 1000)
        return {"sent": post_id}

    wf = Workflow("bench-async", "1")

    @wf.stage("research")
    async def research(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        p = ctx.params
        found = await ctx.call(search, q=f"topic-{p['i']}", ms=p["ms"][0])
        page = await ctx.call(fetch, url=found["hits"][0], ms=p["ms"][1])
        return {"url": page["url"], "words": page["words"]}

    @wf.stage("publish")
    async def publish(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        p = ctx.params
        done = await ctx.call(post, title=ctx.output_of("research")["url"], ms=p["ms"][2])
        await ctx.call(notify, post_id=done["external_id"], ms=p["ms"][3])
        return {"post": done["external_id"]}

    return wf


def sync_workflow(park: _Park, entered: Callable[[], None]) -> Workflow:
    """``bench-threaded@1``: the same shape as :func:`async_workflow` with ``def`` stages and tools."""

    @tool("bench.search", policy=ReplayPolicy.SAFE)
    def search(call: CallInfo, q: str, ms: int) -> dict[str, Any]:
        park.wait_here()
        time.sleep(ms / 1000)
        return {"q": q, "hits": [f"{q}/{k}" for k in range(3)]}

    @tool("bench.fetch", policy=ReplayPolicy.IDEMPOTENT)
    def fetch(call: CallInfo, url: str, ms: int) -> dict[str, Any]:
        time.sleep(ms / 1000)
        return {"url": url, "words": 120 + len(url)}

    @tool("bench.post", policy=ReplayPolicy.IDEMPOTENT, effect=True, target="sink:posts", delivery=_delivery)
    def post(call: CallInfo, title: str, ms: int) -> dict[str, Any]:
        entered()
        time.sleep(ms / 1000)
        return {"external_id": f"post-{call.run_id}", "title": title}

    @tool("bench.notify", policy=ReplayPolicy.SAFE)
    def notify(call: CallInfo, post_id: str, ms: int) -> dict[str, Any]:
        time.sleep(ms / 1000)
        return {"sent": post_id}

    wf = Workflow("bench-threaded", "1")

    @wf.stage("research")
    def research(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        p = ctx.params
        found = ctx.call(search, q=f"topic-{p['i']}", ms=p["ms"][0])
        page = ctx.call(fetch, url=found["hits"][0], ms=p["ms"][1])
        return {"url": page["url"], "words": page["words"]}

    @wf.stage("publish")
    def publish(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        p = ctx.params
        done = ctx.call(post, title=ctx.output_of("research")["url"], ms=p["ms"][2])
        ctx.call(notify, post_id=done["external_id"], ms=p["ms"][3])
        return {"post": done["external_id"]}

    return wf


def log_end(settings: Settings) -> int:
    """Records on the events topic (sum of its partitions' high watermarks)."""
    topic = Topics.of(settings).events
    c = Consumer(settings.consumer_config("bench-watermarks"))
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in md.partitions)
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


def _params(i: int, ms: list[int]) -> dict[str, Any]:
    return {"i": i, "ms": ms}


# -- the asyncio side ---------------------------------------------------------------------------


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
    """``runs`` concurrent runs on one asyncio loop and one :class:`~producers.AsyncRunner`."""
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
    """``runs`` concurrent runs on the sync :class:`~producers.Runner`, one thread per run."""
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
