"""The console's queues page (what waits in a fleet), over real Redis queues and projection: the
queues' pending and running runs per tenant, and the runs waiting durably for a rate limit, in the
page, its refreshed part and JSON. What it would catch: a queue or tenant missing or counted wrong,
a rate-limit wait not shown (or another wait shown as one)."""

from __future__ import annotations

import asyncio
import dataclasses
import re

import pytest
import redis

from runlog.processors.fleet._queues import RedisQueues
from runlog.producers import Queue
from runlog.projections import RedisStore
from runlog.schemas import EventType, Settings
from tests.integration.console.conftest import console
from tests.unit.projections.runlogs import WORKFLOW, RunBuilder
from tests.unit.projections.store_contract import fold_updates

pytestmark = pytest.mark.integration

_TENANT = re.compile(r'<tr class="tenant-row" data-queue="([^"]+)" data-tenant="([^"]+)" '
                     r'data-pending="(\d+)" data-running="(\d+)">')


def test_the_queues_page_shows_queued_runs_per_tenant_and_runs_waiting_for_a_rate_limit(
        console_settings: Settings, redis_client: redis.Redis) -> None:
    s = console_settings
    queues = RedisQueues(redis_client, s.redis_prefix, "runlog-resumer.shop", owner="w1")
    queues.declare(Queue("agents", concurrency=1, weights={"acme": 2}))
    for i, tenant in enumerate(["acme", "acme", "globex"]):
        queues.enqueue("agents", f"r{i}", tenant, 0, 1000 + i, b"{}")
    assert queues.dispatch("agents") != "empty"  # one runs: the queue's one slot
    store = RedisStore(redis_client, s.redis_prefix)
    wf = dataclasses.replace(WORKFLOW, name="shop", version="1")
    limited = RunBuilder("limited").start(wf)
    limited.add(EventType.RUN_WAITING, stage="research", call_id="research/complete/2",
                attributes={"signal": "runlog.limit", "limit": "openai:gpt", "deadline_ms": "4102444800000",
                            "since_ms": "4102444790000"})
    approval = RunBuilder("approval").start(wf)
    approval.add(EventType.RUN_WAITING, stage="research", call_id="research/runlog.wait/0",
                 attributes={"signal": "approval"})
    store.apply(fold_updates(limited.events))
    store.apply(fold_updates(approval.events))

    async def go() -> None:
        async with console(s) as client:
            html = await (await client.get("/queues")).text()
            assert sorted(_TENANT.findall(html)) == [("agents", "acme", "1", "1"),
                                                     ("agents", "globex", "1", "0")]
            assert re.findall(r'<tr class="limit-wait" data-run="([^"]+)"', html) == ["limited"]
            assert "2100-01-01 00:00:00 UTC" in html and 'href="/queues"' in html
            part = await (await client.get("/queues/part")).text()
            assert "<html" not in part and len(_TENANT.findall(part)) == 2
            doc = await (await client.get("/api/queues")).json()
            [q] = doc["queues"]
            assert (q["queue"], q["concurrency"], q["pending"], q["running"]) == ("agents", 1, 2, 1)
            assert [(w["run_id"], w["call_id"], w["until_ms"]) for w in doc["limit_waits"]] == [
                ("limited", "research/complete/2", 4102444800000)]

    asyncio.run(go())
