"""The writer's metrics in an application's registry, after real runs on the real broker: appends,
confirmed-append latency (sync ``send_now`` and async ``asend_now``), delivery failures."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from runlog.producers import AsyncRunner, LocalArtifactStore, Runner
from runlog.producers.log._writer import RunWriter
from runlog.schemas import DeliveryError, EventType, Settings
from tests.integration.producers.conftest import SOURCE
from tests.integration.producers.helpers import events_of, read_events
from tests.integration.producers.test_write_path import content_workflow

pytestmark = pytest.mark.integration
T = EventType

CONFIRMED = {T.RUN_STARTED, T.LEASE_ACQUIRED, T.EFFECT_INTENT, T.EFFECT_RECONCILED, T.RUN_WAITING,
             T.RUN_BLOCKED}
"""The events the SDK appends with ``confirm=True``."""


def _hist(reg: CollectorRegistry, mode: str) -> tuple[float, float]:
    count = reg.get_sample_value("runlog_writer_confirmed_append_seconds_count", {"mode": mode})
    total = reg.get_sample_value("runlog_writer_confirmed_append_seconds_sum", {"mode": mode})
    return count or 0.0, total or 0.0


def test_sync_and_async_runs_count_their_appends_and_confirmed_latency(topics: Settings) -> None:
    wf = content_workflow()
    sync_reg, async_reg = CollectorRegistry(), CollectorRegistry()
    writer = RunWriter(topics, metrics_registry=sync_reg)
    with Runner.from_settings(topics, source=SOURCE, writer=writer) as runner:
        sync_run = runner.run(wf, {"topic": "kafka"}, inputs={"facts": "v1"})
    writer.close()

    async def main() -> Any:
        w = RunWriter(topics, metrics_registry=async_reg)
        try:
            async with AsyncRunner.from_settings(topics, source=SOURCE, writer=w) as r:
                return await r.run(wf, {"topic": "kafka"}, inputs={"facts": "v2"})
        finally:
            w.close()

    async_run = asyncio.run(main())
    assert sync_run.completed and async_run.completed
    log = read_events(topics)
    for reg, run_id, mode, other in ((sync_reg, sync_run.run_id, "sync", "async"),
                                     (async_reg, async_run.run_id, "async", "sync")):
        events = [r.event for r in events_of(log, run_id)]
        confirmed = [e for e in events if e.type in CONFIRMED]
        assert {e.type for e in confirmed} >= {T.RUN_STARTED, T.EFFECT_INTENT}
        assert reg.get_sample_value("runlog_writer_appends_total") == len(events)
        count, total = _hist(reg, mode)
        assert count == len(confirmed), (mode, count, [e.type for e in confirmed])
        assert total > 0
        assert reg.get_sample_value("runlog_writer_confirmed_append_seconds_bucket",
                                    {"mode": mode, "le": "+Inf"}) == count
        assert _hist(reg, other) == (0.0, 0.0)
        text = generate_latest(reg).decode()  # what an application's /metrics route would serve
        line = f'runlog_writer_confirmed_append_seconds_count{{mode="{mode}"}} {float(len(confirmed))}'
        assert line in text.splitlines()


def test_a_failed_delivery_is_counted_by_its_error(topics: Settings) -> None:
    reg = CollectorRegistry()
    dead = topics.with_(kafka_bootstrap_servers="127.0.0.1:1")
    writer = RunWriter(dead, metrics_registry=reg,
                       producer_overrides={"message.timeout.ms": 1500, "log_level": 0})
    live = Runner.from_settings(topics, source=SOURCE)
    runner = Runner(writer, live.leases, LocalArtifactStore(topics.artifact_root), source=SOURCE,
                    run_keys=live.run_keys)
    try:
        with pytest.raises(DeliveryError, match=r"MSG_TIMED_OUT|timed out"):
            runner.run(content_workflow(), {"topic": "kafka"}, inputs={"facts": "v1"})
    finally:
        live.close()
        writer.close(timeout=3)
    assert reg.get_sample_value("runlog_writer_appends_total") == 1  # RUN_STARTED, then it stopped
    failures = {s.labels["error"]: s.value for m in reg.collect() for s in m.samples
                if s.name == "runlog_writer_delivery_failures_total"}
    assert failures == {"_MSG_TIMED_OUT": 1}, failures
    # the confirmed RUN_STARTED waited for its (failed) delivery report
    count, total = _hist(reg, "sync")
    assert count == 1 and total >= 1.0
