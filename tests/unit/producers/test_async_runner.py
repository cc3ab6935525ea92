"""The asyncio form: ``async def`` stages and tools, the AsyncRunner, and both forms producing the
same log for the same workflow (one protocol implementation), on the in-memory adapters.

No pytest-asyncio: each test runs its coroutine with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from runlog.producers import (
    AsyncStageContext,
    CallInfo,
    Diverged,
    StageContext,
    Workflow,
    rule,
    tool,
)
from runlog.producers.calls._ledger import InMemoryEffectLedger
from runlog.producers.define._inputs import DictInputSource
from runlog.projections import RunStatus
from runlog.projections.fold import fold_all
from runlog.schemas import EventType, ReplayPolicy, RunEvent
from tests.unit._schema_log import RecordingSchemaLog
from tests.unit.producers._replay import MemoryWorld, again_async

T = EventType
SOURCE = DictInputSource({"facts": {"v1": {"claims": ["a", "b"]}}})


class World(MemoryWorld):
    """In-memory adapters shared by a sync and an async runner, and what the tools really did."""

    def __init__(self) -> None:
        super().__init__(SOURCE)
        self.calls: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.sync = self.runner
        self.aio = self.async_runner()

        @tool("search", policy=ReplayPolicy.SAFE)
        async def search(call: CallInfo, q: str) -> dict[str, Any]:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                await asyncio.sleep(0.01)
            finally:
                self.in_flight -= 1
            self.calls.append(f"search:{q}")
            return {"hits": [q.upper(), f"{q}-2"]}

        @tool("score", policy=ReplayPolicy.SAFE)
        def score(call: CallInfo, text: str) -> dict[str, Any]:  # a def tool in an async stage
            self.calls.append(f"score:{text}")
            return {"score": len(text)}

        @tool("upload", policy=ReplayPolicy.IDEMPOTENT, effect=True, target="cdn:assets",
              delivery=lambda a, c: ("acct", "cdn", a["name"], "1"))
        async def upload(call: CallInfo, name: str) -> dict[str, Any]:
            self.calls.append(f"upload:{name}")
            assert call.idempotency_key
            return {"external_id": f"asset-{name}"}

        self.search, self.score, self.upload = search, score, upload

    def workflow(self) -> Workflow:
        wf = Workflow("article", "1")
        search, score, upload = self.search, self.score, self.upload

        @wf.stage("research", inputs=["facts"], rules=[rule("two hits", lambda o: len(o["hits"]) == 2)])
        async def research(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
            assert inputs["facts"] == {"claims": ["a", "b"]}
            first = ctx.submit(search, q=ctx.params["topic"])  # index 0, taken now
            a, b = await ctx.parallel((search, {"q": "x"}), (score, {"text": "abc"}))  # 1, 2
            return {"hits": (await first)["hits"], "x": a["hits"][0], "score": b["score"]}

        @wf.stage("publish")
        async def publish(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
            hits = ctx.output_of("research")["hits"]
            asset = await ctx.call(upload, name=hits[0])
            return {"asset": asset["external_id"], "at": await ctx.now()}

        return wf


def arun(coro_fn: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    return asyncio.run(coro_fn())


def _shape(events: list[RunEvent]) -> list[tuple[EventType, str | None, str | None]]:
    return [(e.type, e.stage, e.call_id) for e in events]


def test_an_async_workflow_completes_on_the_async_runner() -> None:
    w = World()
    res = arun(lambda: w.aio.run(w.workflow(), {"topic": "kafka"}))
    assert res.completed
    assert res.outputs["research"] == {"hits": ["KAFKA", "kafka-2"], "x": "X", "score": 3}
    assert res.outputs["publish"]["asset"] == "asset-KAFKA"
    evs = w.events(res.run_id)
    state = fold_all(evs)
    assert state is not None and state.status is RunStatus.COMPLETED and state.rejected_total == 0
    called = [e.call_id for e in evs if e.type is T.TOOL_CALLED]
    # indexes in submission order, whatever order the calls finished in
    assert called == ["research/search/0", "research/search/1", "research/score/2", "publish/upload/0",
                      "publish/runlog.now/1"]
    assert T.EFFECT_INTENT in [e.type for e in evs] and w.table.held == {}
    assert w.max_in_flight == 2  # the two searches really ran at once


def test_both_runners_write_the_same_log_for_the_same_async_workflow() -> None:
    w = World()
    a = arun(lambda: w.aio.run(w.workflow(), {"topic": "kafka"}))
    w.ledger = InMemoryEffectLedger()  # a fresh ledger: the second run must call, not reuse
    w.sync.ledger = w.ledger
    b = w.sync.run(w.workflow(), {"topic": "kafka"})  # async stages on a private loop
    assert b.completed
    assert _shape(w.events(a.run_id)) == _shape(w.events(b.run_id))
    hashes = [(e.request_hash, e.delivery_key) for e in w.events(a.run_id)]
    assert hashes == [(e.request_hash, e.delivery_key) for e in w.events(b.run_id)]


def test_a_def_stage_runs_on_a_worker_thread_under_the_async_runner() -> None:
    w = World()
    wf = Workflow("plain", "1")
    threads: list[str] = []

    @wf.stage("only")
    def only(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        threads.append(threading.current_thread().name)
        hits = ctx.call(w.search, q="t")["hits"]  # an async tool from a def stage: run on the loop
        fut = ctx.submit(w.score, text="four")
        return {"hits": hits, "score": fut.result()["score"], "r": ctx.random()}

    async def main() -> Any:
        return await w.aio.run(wf, {})

    res = arun(main)
    assert res.completed and res.outputs["only"]["hits"] == ["T", "t-2"]
    assert threads and threads[0] != threading.main_thread().name
    assert [e.call_id for e in w.events(res.run_id) if e.type is T.TOOL_CALLED] == [
        "only/search/0", "only/score/1", "only/runlog.random/2"]


def test_an_async_resume_reuses_recorded_calls_and_calls_nothing() -> None:
    w = World()
    wf = w.workflow()
    first = arun(lambda: w.aio.run(wf, {"topic": "kafka"}))
    calls = list(w.calls)
    n = len(w.events(first.run_id))

    res = arun(lambda: again_async(w.aio, w.events(first.run_id), wf, {"topic": "kafka"},
                                   recorded_calls=w.recorded(first.run_id)))
    assert res.completed and res.epoch == 2 and res.outputs == first.outputs
    assert w.calls == calls  # nothing called again, not even the clock
    assert [e.type for e in w.events(first.run_id)[n:]] == [
        T.LEASE_ACQUIRED, T.STAGE_STARTED, T.VERIFIED, T.STAGE_STARTED, T.VERIFIED, T.RUN_COMPLETED]


def test_an_async_stage_that_changes_its_request_diverges() -> None:
    w = World()
    wf = w.workflow()
    first = arun(lambda: w.aio.run(wf, {"topic": "kafka"}))

    with pytest.raises(Diverged):
        arun(lambda: again_async(w.aio, w.events(first.run_id), wf, {"topic": "redis"},
                                 recorded_calls=w.recorded(first.run_id)))
    assert [e.type for e in w.events(first.run_id)][-2:] == [T.CALL_DIVERGED, T.RUN_BLOCKED]
    assert "search:redis" not in w.calls
    assert w.table.held == {}


def test_an_effect_done_in_another_run_is_reused_through_the_async_ledger() -> None:
    w = World()
    wf = w.workflow()
    a = arun(lambda: w.aio.run(wf, {"topic": "kafka"}))
    b = arun(lambda: w.aio.run(wf, {"topic": "kafka"}))
    assert a.outputs["publish"]["asset"] == b.outputs["publish"]["asset"] == "asset-KAFKA"
    assert w.calls.count("upload:KAFKA") == 1  # the second run read the ledger, did not upload
    rec = [e for e in w.events(b.run_id) if e.type is T.EFFECT_RECONCILED]
    assert rec and rec[0].attributes["source"] == "ledger" and rec[0].attributes["from_run"] == a.run_id


def test_an_async_wait_lets_the_run_go() -> None:
    w = World()
    wf = Workflow("approve", "1")

    @wf.stage("ask")
    async def ask(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"ok": await ctx.wait_for("approval", timeout=60)}

    res = arun(lambda: w.aio.run(wf, {}))
    assert not res.completed and res.waiting == "approval"
    assert [e.type for e in w.events(res.run_id)][-2:] == [T.TOOL_CALLED, T.RUN_WAITING]
    assert w.table.held == {}


def test_a_failing_async_tool_fails_the_stage_after_the_other_calls_finished() -> None:
    w = World()
    wf = Workflow("boom", "1")

    @tool("bad")
    async def bad(call: CallInfo) -> Any:
        raise ValueError("no")

    @wf.stage("s")
    async def s(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        await ctx.parallel((bad, {}), (w.search, {"q": "late"}))
        return {}

    with pytest.raises(ValueError, match="no"):
        arun(lambda: w.aio.run(wf, {}))
    run_id = w.log.run_ids()[0]
    types = [e.type for e in w.events(run_id)]
    assert types.count(T.FAILED) == 1 and T.VERIFIED not in types and T.RUN_COMPLETED not in types
    state = fold_all(w.events(run_id))
    assert state is not None and state.status is RunStatus.FAILED
    assert "search:late" in w.calls  # the sibling call finished and was recorded before the stage ended
    assert w.table.held == {}


def test_many_async_runs_share_one_loop() -> None:
    w = World()
    wf = w.workflow()

    async def main() -> list[Any]:
        return await asyncio.gather(*(w.aio.run(wf, {"topic": f"t{i}"}) for i in range(200)))

    results = arun(main)
    assert all(r.completed for r in results) and len({r.run_id for r in results}) == 200
    assert w.max_in_flight > 100  # the runs' tool calls overlapped on the one loop


def test_the_event_writer_schema_is_published_off_the_loop_before_the_first_run() -> None:
    """The first encode of an event publishes its writer schema and waits for the broker: the
    AsyncRunner publishes it on a thread before its first run, so the loop never waits for it, and
    runs started together publish it once."""
    from runlog.schemas import Codec

    schema_log = RecordingSchemaLog()
    published = schema_log.published
    w = World()
    w.log.codec = Codec().with_schema_log(schema_log)

    async def main() -> list[Any]:
        return list(await asyncio.gather(*(w.aio.run(w.workflow(), {"topic": t}) for t in ("a", "b", "c"))))

    results = arun(main)
    assert all(r.completed for r in results)
    loop_thread = threading.main_thread().name
    assert sorted(name for name, _ in published) == ["runlog.ResumeRequest", "runlog.RunEvent",
                                                     "runlog.StreamRecord"]  # once each
    assert all(thread != loop_thread for _, thread in published), published


def test_a_failed_schema_publish_is_tried_again_by_the_next_run() -> None:
    from runlog.schemas import Codec

    class Failing(RecordingSchemaLog):
        def publish(self, record_name: str, fingerprint: bytes, schema: dict[str, Any]) -> None:
            if not self.published:
                self.published.append(("refused", threading.current_thread().name))
                raise RuntimeError("broker refused")
            super().publish(record_name, fingerprint, schema)

    schema_log = Failing()
    w = World()
    w.log.codec = Codec().with_schema_log(schema_log)

    async def main() -> Any:
        with pytest.raises(RuntimeError, match="broker refused"):
            await w.aio.run(w.workflow(), {"topic": "a"})
        return await w.aio.run(w.workflow(), {"topic": "b"})

    assert arun(main).completed
    assert [name for name, _ in schema_log.published][:2] == ["refused", "runlog.RunEvent"]
    assert schema_log.published[1][1] != threading.main_thread().name


def test_a_schema_publish_cancelled_with_its_loop_is_published_again_on_the_next_loop() -> None:
    """A run that times out while the first publish is under way ends its loop, which cancels the
    publish: the runner's next loop publishes again instead of failing every later run."""
    from runlog.schemas import Codec

    release = threading.Event()

    class Slow(RecordingSchemaLog):
        def publish(self, record_name: str, fingerprint: bytes, schema: dict[str, Any]) -> None:
            release.wait(5)
            super().publish(record_name, fingerprint, schema)

    schema_log = Slow()
    w = World()
    w.log.codec = Codec().with_schema_log(schema_log)

    async def timed_out() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(w.aio.run(w.workflow(), {"topic": "a"}), 0.05)

    threading.Timer(0.3, release.set).start()  # the loop's end waits for the publishing thread
    arun(timed_out)
    assert arun(lambda: w.aio.run(w.workflow(), {"topic": "b"})).completed
