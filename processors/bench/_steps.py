"""Durable steps per second: orchestration itself, with tools that return at once.

N concurrent runs in one process of ``bench-steps@1``: stage ``gather`` makes four SAFE calls, stage
``act`` three SAFE calls and one IDEMPOTENT effect (its own delivery key per run), so a run is eight
durable calls and one confirmed ``EFFECT_INTENT``. The tools return at once: what is measured is
what Runlog does around a call (arguments and results stored, events encoded and produced, the
lease checked, the effect's intent confirmed, the ledger claimed and closed).

Per point (N runs) and side: durable calls per second (``8 * N`` over the wall time), events per
second (the events topic's high watermarks before and after), and CPU microseconds per call (the
process's CPU time, every thread included: librdkafka's and the delivery-report thread's, over the
calls). The AsyncRunner admits at most :data:`ADMIT` runs at once on one loop; the sync Runner runs
them on a pool of :data:`THREADS` threads.

The baseline, in the same run on the same broker and Redis, is the minimum I/O those calls need
with the raw clients, on one asyncio loop with the same admission: per run, the same number of
events as Runlog's side produced per run (fastavro-encoded run events, produced with the same
producer configuration to a topic of the same shape), one Redis round trip per call (a ``SET`` on
redis-py's asyncio client), and two confirmed records (the effect's intent and the run's last
event, each awaited until its delivery report). ``steps_ratio`` is Runlog's async calls per second
over the baseline's at the largest N.

The namespace's projection marker is set ``ready`` first, as a deployment's projector leaves it: the
effects ledger then trusts Redis for a key it has never seen instead of reading the effects topic
(:mod:`runlog.producers.calls._ledger_topic`), which is its behaviour only while a projection is missing or
being rebuilt.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import fastavro

from runlog.processors.bench._concurrency import log_end
from runlog.processors.bench._env import BenchEnv
from runlog.processors.bench._events import history
from runlog.processors.bench._write import RawWriter
from runlog.producers import (
    AsyncRunner,
    AsyncStageContext,
    CallInfo,
    ReplayPolicy,
    Runner,
    StageContext,
    Workflow,
    tool,
)
from runlog.projections.internal import READY, marker_key
from runlog.schemas.internal import aredis_client
from runlog.schemas.settings import Settings

__all__ = ["ADMIT", "CALLS_PER_RUN", "THREADS", "bench_steps"]

CALLS_PER_RUN = 8
ADMIT = 256
"""Runs under way at once on the loop (the AsyncRunner and the baseline)."""
THREADS = 64
"""The sync Runner's pool of threads."""

Tick = Callable[[str], None]
Measured = tuple[float, float, int, int, list[str]]
"""Seconds, CPU seconds, events appended, runs completed, errors."""


def _delivery(args: Any, call: CallInfo) -> tuple[str, str, str, str]:
    return ("bench", "steps", call.run_id, "1")  # one delivery key per run: always executed


def async_workflow() -> Workflow:
    """``bench-steps@1`` with ``async def`` stages and tools."""

    @tool("steps.read", policy=ReplayPolicy.SAFE)
    async def read(call: CallInfo, q: str) -> dict[str, Any]:
        return {"q": q, "n": len(q)}

    @tool("steps.post", policy=ReplayPolicy.IDEMPOTENT, effect=True, target="sink:steps", delivery=_delivery)
    async def post(call: CallInfo, title: str) -> dict[str, Any]:
        return {"external_id": f"post-{call.run_id}"}

    wf = Workflow("bench-steps", "1")

    @wf.stage("gather")
    async def gather(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        got = [await ctx.call(read, q=f"{ctx.params['i']}-{k}") for k in range(4)]
        return {"n": sum(g["n"] for g in got)}

    @wf.stage("act")
    async def act(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        for k in range(3):
            await ctx.call(read, q=f"act-{ctx.params['i']}-{k}")
        done = await ctx.call(post, title=str(ctx.output_of("gather")["n"]))
        return {"post": done["external_id"]}

    return wf


def sync_workflow() -> Workflow:
    """The same shape with ``def`` stages and tools, for the sync Runner."""

    @tool("steps.read", policy=ReplayPolicy.SAFE)
    def read(call: CallInfo, q: str) -> dict[str, Any]:
        return {"q": q, "n": len(q)}

    @tool("steps.post", policy=ReplayPolicy.IDEMPOTENT, effect=True, target="sink:steps", delivery=_delivery)
    def post(call: CallInfo, title: str) -> dict[str, Any]:
        return {"external_id": f"post-{call.run_id}"}

    wf = Workflow("bench-steps-sync", "1")

    @wf.stage("gather")
    def gather(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        got = [ctx.call(read, q=f"{ctx.params['i']}-{k}") for k in range(4)]
        return {"n": sum(g["n"] for g in got)}

    @wf.stage("act")
    def act(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        for k in range(3):
            ctx.call(read, q=f"act-{ctx.params['i']}-{k}")
        done = ctx.call(post, title=str(ctx.output_of("gather")["n"]))
        return {"post": done["external_id"]}

    return wf


def _point(kind: str, n: int, seconds: float, cpu_s: float, events: int, completed: int,
           errors: list[str]) -> dict[str, Any]:
    calls = n * CALLS_PER_RUN
    return {"kind": kind, "runs": n, "completed": completed, "failed": len(errors), "errors": errors[:3],
            "seconds": seconds, "calls": calls, "calls_per_s": calls / seconds if seconds else 0.0,
            "events": events, "events_per_run": events / n if n else 0.0,
            "events_per_s": events / seconds if seconds else 0.0,
            "cpu_us_per_call": cpu_s / calls * 1e6 if calls else 0.0}


def _outcome(seconds: float, cpu: float, ev0: int, settings: Settings, outcomes: list[Any]) -> Measured:
    completed = sum(1 for o in outcomes if not isinstance(o, BaseException) and o.completed)
    errors = [f"{type(o).__name__}: {o}" for o in outcomes if isinstance(o, BaseException)]
    return seconds, cpu, log_end(settings) - ev0, completed, errors


async def _runlog_async(settings: Settings, n: int, first: int) -> Measured:
    wf = async_workflow()
    async with AsyncRunner.from_settings(settings) as r:
        await r.run(wf, {"i": -1 - first})  # warm: connections, topics' metadata
        ev0 = log_end(settings)
        gate = asyncio.Semaphore(ADMIT)

        async def one(i: int) -> Any:
            async with gate:
                return await r.run(wf, {"i": i})

        t0, c0 = time.perf_counter(), time.process_time()
        outcomes = await asyncio.gather(*(one(first + i) for i in range(n)), return_exceptions=True)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return _outcome(seconds, cpu, ev0, settings, outcomes)


def _runlog_threads(settings: Settings, n: int, first: int) -> Measured:
    wf = sync_workflow()
    with Runner.from_settings(settings) as r:
        r.run(wf, {"i": -1 - first})
        ev0 = log_end(settings)
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(n, THREADS),
                                                   thread_name_prefix="bench-steps") as pool:
            t0, c0 = time.perf_counter(), time.process_time()
            futures = [pool.submit(r.run, wf, {"i": first + i}) for i in range(n)]
            outcomes: list[Any] = []
            for f in futures:
                try:
                    outcomes.append(f.result())
                except Exception as err:  # noqa: BLE001 -- reported in the figures
                    outcomes.append(err)
            seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return _outcome(seconds, cpu, ev0, settings, outcomes)


class _RawSide:
    """The baseline's clients: a producer served by a thread of its own (as Runlog's writer is), a
    fastavro encoder, an asyncio Redis client."""

    def __init__(self, env: BenchEnv, settings: Settings, topic: str) -> None:
        raw = RawWriter(env, settings, topic)
        self.schema, self.header = raw.schema, raw.header
        self.record = raw.as_record(next(history("run-steps-raw", 5, 5)))
        self.producer = raw.producer  # the baseline's own producer (the same configuration as Runlog's)
        self.topic = topic
        self.errors = 0
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._serve, name="bench-steps-raw-poll", daemon=True)
        self._poller.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            self.producer.poll(0.05)

    def _encode(self, seq: int) -> bytes:
        b = io.BytesIO()
        b.write(self.header)
        fastavro.schemaless_writer(b, self.schema, {**self.record, "seq": seq})
        return b.getvalue()

    def produce(self, key: bytes, seq: int, confirmed: asyncio.Future[None] | None = None) -> None:
        loop = confirmed.get_loop() if confirmed is not None else None

        def cb(err: object, _msg: object) -> None:
            if err is not None:
                self.errors += 1
            if loop is not None and confirmed is not None:
                loop.call_soon_threadsafe(confirmed.set_result, None)

        value = self._encode(seq)
        while True:
            try:
                self.producer.produce(self.topic, value=value, key=key, on_delivery=cb)
                return
            except BufferError:
                time.sleep(0.001)

    def close(self) -> None:
        self.producer.flush(30)
        self._stop.set()
        self._poller.join(5)


async def _raw(side: _RawSide, settings: Settings, n: int, events_per_run: int) -> tuple[float, float]:
    overhead = max(events_per_run - 2 * CALLS_PER_RUN, 2)
    before, after = overhead // 2, overhead - overhead // 2
    client = aredis_client(settings, max_connections=ADMIT)
    prefix = f"{settings.redis_prefix}:raw"
    gate = asyncio.Semaphore(ADMIT)
    loop = asyncio.get_running_loop()

    async def confirmed(key: bytes, seq: int) -> None:
        fut: asyncio.Future[None] = loop.create_future()
        side.produce(key, seq, fut)
        await fut

    async def one(i: int) -> None:
        async with gate:
            key, seq = f"run-raw-{i}".encode(), 0
            for _ in range(before):
                seq += 1
                side.produce(key, seq)
            for k in range(CALLS_PER_RUN):
                await client.set(f"{prefix}:{i}:{k}", b"1", px=60_000)  # one round trip per call
                seq += 1
                side.produce(key, seq)  # the call
                if k == CALLS_PER_RUN - 1:
                    seq += 1
                    await confirmed(key, seq)  # the effect's intent, acknowledged before the call
                seq += 1
                side.produce(key, seq)  # its result
            for _ in range(after - 2):
                seq += 1
                side.produce(key, seq)
            seq += 1
            await confirmed(key, seq)  # the run's last event

    try:
        t0, c0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one(i) for i in range(n)))
        return time.perf_counter() - t0, time.process_time() - c0
    finally:
        await client.aclose(close_connection_pool=True)  # the pool is its own: every socket closed


def bench_steps(env: BenchEnv, *, runs: Sequence[int], tick: Tick) -> dict[str, Any]:
    """Each of ``runs`` concurrent runs on the AsyncRunner, the sync Runner and the raw baseline."""
    settings = env.settings("steps")
    env.redis.hset(marker_key(settings.redis_prefix), mapping={"gen": f"bench-{env.tag}", "state": READY})
    side = _RawSide(env, settings, env.raw_topic(settings, "raw.steps"))
    points: list[dict[str, Any]] = []
    first = 0
    try:
        for n in runs:
            a = _point("asyncio", n, *asyncio.run(_runlog_async(settings, n, first)))
            first += n + 1
            tick(f"steps: {n} async runs")
            per_run = round(a["events_per_run"])
            seconds, cpu = asyncio.run(_raw(side, settings, n, per_run))
            raw = _point("raw", n, seconds, cpu, per_run * n, n, [])
            tick(f"steps: {n} raw runs")
            t = _point("threads", n, *_runlog_threads(settings, n, first))
            first += n + 1
            tick(f"steps: {n} threaded runs")
            for p in (a, t):
                p["ratio"] = p["calls_per_s"] / raw["calls_per_s"] if raw["calls_per_s"] else 0.0
            points.append({"runs": n, "asyncio": a, "threads": t, "raw": raw})
    finally:
        side.close()
    last = points[-1]
    return {"points": points, "admit": ADMIT, "threads": THREADS, "calls_per_run": CALLS_PER_RUN,
            "raw_delivery_errors": side.errors,
            "steps_ratio": last["asyncio"]["ratio"], "steps_calls_per_s": last["asyncio"]["calls_per_s"],
            "steps_threads_ratio": last["threads"]["ratio"]}
