"""The AsyncRunner against the real broker and Redis: the same log as the Runner, many runs on one loop,
confirmed appends awaited (never a blocked loop), lease heartbeats on the loop, no thread per run."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import redis

from runlog.producers import AsyncRunner, AsyncStageContext, CallInfo, ReplayPolicy, Runner, Workflow, tool
from runlog.projections import RunStatus
from runlog.projections.fold import fold_all
from runlog.schemas import EventType, Settings
from tests.integration.producers.conftest import SOURCE
from tests.integration.producers.helpers import events_of, read_events
from tests.integration.producers.test_write_path import EXPECTED, content_workflow

pytestmark = pytest.mark.integration
T = EventType


def test_the_async_runner_writes_the_same_sequence_as_the_runner(topics: Settings) -> None:
    wf = content_workflow()

    async def main() -> Any:
        async with AsyncRunner.from_settings(topics, source=SOURCE) as r:
            return await r.run(wf, {"topic": "kafka"}, inputs={"facts": "v1"})

    result = asyncio.run(main())  # def stages: each on a worker thread, appends hop onto the loop
    assert result.completed
    events = [r.event for r in events_of(read_events(topics), result.run_id)]
    assert [(e.type, e.stage, e.call_id) for e in events] == EXPECTED
    assert [e.seq for e in events] == list(range(1, len(EXPECTED) + 1))
    with Runner.from_settings(topics, source=SOURCE) as sync:
        again = sync.run(wf, {"topic": "kafka"}, inputs={"facts": "v1"})
    sync_events = [r.event for r in events_of(read_events(topics), again.run_id)]
    n = EXPECTED.index((T.TOOL_CALLED, "publish", "publish/publish/0")) + 1
    shape = [(e.type, e.request_hash) for e in events]
    assert [(e.type, e.request_hash) for e in sync_events][:n] == shape[:n]
    # the article's delivery key is shared by both runs: the sync run found the async run's post done
    reused = sync_events[n]
    assert reused.type is T.EFFECT_RECONCILED and reused.attributes["from_run"] == result.run_id


def _fanout(calls: list[str]) -> Workflow:
    @tool("fetch", policy=ReplayPolicy.SAFE)
    async def fetch(call: CallInfo, i: int) -> dict[str, Any]:
        await asyncio.sleep(0.05)
        calls.append(call.call_id)
        return {"i": i}

    @tool("post", policy=ReplayPolicy.IDEMPOTENT, effect=True, target="sink:posts",
          delivery=lambda a, c: ("acct", "sink", c.run_id, "1"))
    async def post(call: CallInfo, n: int) -> dict[str, Any]:
        await asyncio.sleep(0.02)
        return {"external_id": f"post-{call.run_id}-{n}"}

    wf = Workflow("fanout", "1")

    @wf.stage("gather")
    async def gather(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        got = await ctx.parallel(*[(fetch, {"i": i}) for i in range(3)])
        return {"n": sum(g["i"] for g in got)}

    @wf.stage("send")
    async def send(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"id": (await ctx.call(post, n=ctx.output_of("gather")["n"]))["external_id"]}

    return wf


def test_many_async_runs_on_one_loop_complete_with_one_heartbeat_thread(topics: Settings) -> None:
    settings = topics.with_(lease_ttl_ms=5000)  # short, yet above a loaded 2-core machine's loop lag
    calls: list[str] = []
    wf = _fanout(calls)
    lags: list[float] = []

    async def watch_loop(stop: asyncio.Event) -> None:
        """The loop's responsiveness: a blocking append or round trip would show as a long lag."""
        while not stop.is_set():
            t0 = time.monotonic()
            await asyncio.sleep(0.01)
            lags.append(time.monotonic() - t0 - 0.01)

    async def main() -> list[Any]:
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch_loop(stop))
        async with AsyncRunner.from_settings(settings) as r:
            results = await asyncio.gather(*(r.run(wf, {"k": i}) for i in range(200)),
                                           return_exceptions=True)
            beating = [t for t in threading.enumerate() if t.name == "runlog-lease-heartbeat"]
            # a run longer than the lease ttl keeps its lease: the heartbeat thread beats it
            slow = Workflow("slow", "1")

            @slow.stage("wait")
            async def wait(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
                await asyncio.sleep(settings.lease_ttl_ms / 1000 * 1.5)
                return {"at": await ctx.now()}

            long = await r.run(slow, {})
        stop.set()
        await watcher
        return [results, beating, long]

    before = [t for t in threading.enumerate() if t.name == "runlog-lease-heartbeat"]
    results, beating, long = asyncio.run(main())
    failed = [x for x in results if isinstance(x, BaseException)]
    assert not failed, failed[:3]
    assert all(x.completed for x in results) and len({x.run_id for x in results}) == 200
    assert long.completed  # the lease outlived 1.5 ttl: a lost lease would have raised LeaseLost
    assert len(set(beating) - set(before)) == 1  # one heartbeat thread for 200 runs' leases
    assert len(calls) == 600
    reads = read_events(topics)
    for x in results[:20]:
        evs = [r.event for r in events_of(reads, x.run_id)]
        state = fold_all(evs)
        assert state is not None and state.status is RunStatus.COMPLETED and state.rejected_total == 0
        assert [e.type for e in evs].count(T.EFFECT_INTENT) == 1
    lags.sort()
    assert lags and lags[len(lags) // 2] < 0.05, lags[-10:]  # the loop was not held by blocking I/O
    r = redis.Redis.from_url(settings.redis_url, **settings.redis_kwargs())
    try:
        held = [k for k in r.scan_iter(match=f"{settings.redis_prefix}:{{run-*}}:lease", count=1000)]
        assert held == []  # every lease released
    finally:
        r.close()
