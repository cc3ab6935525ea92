"""Many runs through one producer, and delivery failures that must surface."""

from __future__ import annotations

import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from runlog.producers import CallInfo, LocalArtifactStore, Runner, RunResult, Workflow, tool
from runlog.producers.log._writer import RunWriter
from runlog.schemas import EventType, ReplayPolicy, Settings
from runlog.schemas.errors import DeliveryError
from tests.integration.producers.conftest import SOURCE
from tests.integration.producers.helpers import read_events

pytestmark = pytest.mark.integration
T = EventType
RUNS = 200


def _wf() -> Workflow:
    @tool("step", policy=ReplayPolicy.IDEMPOTENT)
    def step(call: CallInfo, n: int) -> int:
        return n + 1

    wf = Workflow("many", "1")

    @wf.stage("one")
    def one(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"n": ctx.call(step, n=ctx.params["n"])}

    @wf.stage("two", inputs=["facts"])
    def two(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        a = ctx.submit(step, n=ctx.output_of("one")["n"])
        b = ctx.submit(step, n=len(inputs["facts"]["claims"]))
        return {"n": a.result(), "m": b.result()}

    return wf


def _second_read(settings: Settings, partition: int, run_id: str) -> dict[str, Any]:
    """What a plain consumer finds of ``run_id`` on ``partition`` (a failure's diagnosis: whether
    the reader or the log misses a record)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from runlog.schemas import Codec, RunEvent, Topics

    topic = Topics.of(settings).events
    c = Consumer(settings.consumer_config(f"t-second-{run_id[-8:]}", **{"enable.auto.commit": False}))
    try:
        lo, hi = c.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
        c.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
        found, last = [], lo - 1
        while last < hi - 1:
            m = c.poll(10)
            if m is None:
                break
            if m.error() is None:
                last = m.offset()
                if m.key() == run_id.encode():
                    found.append((m.offset(), Codec().decode(m.value(), RunEvent).seq))
        return {"watermarks": (lo, hi), "read_to": last, "records": found}
    finally:
        c.close()


def test_200_concurrent_runs_are_each_gapless_in_order_on_one_partition(topics: Settings) -> None:
    wf = _wf()
    go = threading.Barrier(RUNS, timeout=60)
    # the production lease ttl: 200 runnable threads on 2 cores can keep the heartbeat thread from the
    # interpreter for more than the tests' 3 s ttl allows (LeaseLost), which is not what this test checks
    runner = Runner.from_settings(topics.with_(lease_ttl_ms=15_000), source=SOURCE)

    def one_run(n: int) -> RunResult:
        go.wait()
        return runner.run(wf, {"n": n})

    try:
        with ThreadPoolExecutor(RUNS) as pool:
            results = list(pool.map(one_run, range(RUNS)))
    finally:
        runner.close()
    assert len({r.run_id for r in results}) == RUNS
    assert all(r.outputs["two"]["n"] == n + 2 for n, r in enumerate(results))

    by_run: dict[str, list[tuple[int, int, int, T, int]]] = defaultdict(list)
    for r in read_events(topics, timeout=120):
        e = r.event
        by_run[e.run_id].append((r.partition, r.offset, e.seq, e.type, e.epoch))
    assert set(by_run) == {r.run_id for r in results}
    expected_types = [T.RUN_STARTED, T.STAGE_STARTED, T.TOOL_CALLED, T.TOOL_RESULT, T.VERIFIED,
                      T.STAGE_STARTED, T.TOOL_CALLED, T.TOOL_CALLED, T.TOOL_RESULT, T.TOOL_RESULT,
                      T.VERIFIED, T.RUN_COMPLETED]
    partitions = set()
    for run_id, recs in by_run.items():
        assert len({p for p, *_ in recs}) == 1, f"{run_id} spans partitions"
        partitions.add(recs[0][0])
        recs.sort(key=lambda x: x[1])  # log order
        assert [seq for _, _, seq, _, _ in recs] == list(range(1, len(recs) + 1)), \
            (run_id, recs, _second_read(topics, recs[0][0], run_id))
        types = [t for *_, t, _ in recs]
        # the two parallel calls of stage two may interleave; everything else is fixed
        assert types[:6] + sorted(types[6:10]) + types[10:] == \
            expected_types[:6] + sorted(expected_types[6:10]) + expected_types[10:]
        assert types[6] is T.TOOL_CALLED
        assert {ep for *_, ep in recs} == {1}
    assert len(partitions) > 1  # runs spread over partitions by key


def test_a_delivery_failure_is_raised_not_dropped(topics: Settings) -> None:
    dead = topics.with_(kafka_bootstrap_servers="127.0.0.1:1")
    writer = RunWriter(dead, producer_overrides={"message.timeout.ms": 1500, "log_level": 0})
    live = Runner.from_settings(topics, source=SOURCE)
    runner = Runner(writer, live.leases, LocalArtifactStore(topics.artifact_root), source=SOURCE,
                    run_keys=live.run_keys)
    try:
        with pytest.raises(DeliveryError, match=r"MSG_TIMED_OUT|timed out"):
            runner.run(_wf(), {"n": 1})
        with pytest.raises(DeliveryError):
            runner.start_run(_wf(), {"n": 2}, idempotency_key="k")
        # the failed start gave its idempotency key back: a healthy writer may use it
        again = live.start_run(_wf(), {"n": 2}, idempotency_key="k")
        assert again.created and again.session is not None
        again.session.close()
    finally:
        live.close()
        writer.close(timeout=3)
    assert [r.event.type for r in read_events(topics)] == [T.RUN_STARTED]
