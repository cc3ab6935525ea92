"""The workload of the concurrency bench: the same two-stage, four-call workflow for the loop and
for threads (tools that wait a seeded 20-200 ms, one IDEMPOTENT effect per run), the writer that
times each confirmed ``EFFECT_INTENT``, and the park where every run waits once so memory is
sampled with all of them open."""

from __future__ import annotations

import asyncio
import contextvars
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from runlog.producers import (
    AsyncStageContext,
    CallInfo,
    ReplayPolicy,
    StageContext,
    Workflow,
    tool,
)
from runlog.producers.internal import DeliveryCallback, RunWriter
from runlog.schemas import EventType, RunEvent
from runlog.schemas.errors import DeliveryError
from runlog.schemas.internal import TraceContext
from runlog.schemas.settings import Settings

__all__ = ["ADMIT", "CALLS_PER_RUN", "TimedWriter", "async_workflow", "latencies", "sync_workflow"]


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

    def produce(self, event: RunEvent, on_delivery: DeliveryCallback,
                trace: TraceContext | None = None) -> str:
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

        return super().produce(event, cb, trace)

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


def _params(i: int, ms: list[int]) -> dict[str, Any]:
    return {"i": i, "ms": ms}


# -- the asyncio side ---------------------------------------------------------------------------
