"""The console's versions page and the runs parked for a version's member (issue #25 item 4), over a
real Redis projection and the version routing keys (the state of ``runlog versions``' tests).

What each test would catch: a version missing from the page or counted wrong, a version no live
member serves not named, a parked run shown without what it waits for (list, JSON, run page), a
projection not ready counted as if it were the truth."""

from __future__ import annotations

import asyncio
import re

import pytest
import redis

from runlog.processors.resume._versions import VersionRoutes
from runlog.projections import RedisStore
from runlog.schemas import Settings
from tests.integration.console.conftest import console
from tests.integration.resume.test_drains import populate

pytestmark = pytest.mark.integration

_ROW = re.compile(r'<tr class="version-row" data-version="([^"]+)" data-open="(\d+)" data-parked="(\d+)" '
                  r'data-drained="(true|false)">')
_WAIT = "waits for a member serving orders@1 (none live)"


def test_the_versions_page_and_the_run_list_show_what_waits_for_a_version_member(
        console_settings: Settings, redis_client: redis.Redis) -> None:
    s = console_settings
    populate(RedisStore(redis_client, s.redis_prefix), VersionRoutes(redis_client, s.redis_prefix))

    async def go() -> None:
        async with console(s) as client:
            html = await (await client.get("/versions")).text()
            assert _ROW.findall(html) == [("orders@1", "3", "1", "false"), ("orders@2", "1", "0", "false"),
                                          ("orders@3", "0", "0", "true")]
            assert re.findall(r'class="message bad unserved" data-version="([^"]+)"', html) == ["orders@1"]
            assert "no live member serves orders@1: 3 open runs" in html and 'href="/versions"' in html
            part = await (await client.get("/versions/part")).text()
            assert "<html" not in part and len(_ROW.findall(part)) == 3
            doc = await (await client.get("/api/versions")).json()
            assert doc["note"] is None
            assert [(v["version"], v["open"], v["members"]) for v in doc["versions"]] == [
                ("orders@1", 3, []), ("orders@2", 1, ["m-v2"]), ("orders@3", 0, ["m-v2"])]

            runs = await (await client.get("/")).text()
            row = re.search(r'<tr class="run-row" data-run="o1-a-running".*?</tr>',
                            runs.split('class="runs-table"', 1)[1], re.S)
            assert row is not None and _WAIT in row.group(0)
            assert runs.count(_WAIT) == 1  # only the parked run (it is RUNNING: not in the attention panel)
            doc = await (await client.get("/api/runs")).json()
            listed = {r["run_id"]: r["version_wait"] for r in doc["runs"]}
            assert listed["o1-a-running"] == _WAIT and listed["o1-b-failed"] == listed["o2-a-running"] == ""
            page = await (await client.get("/runs/o1-a-running")).text()
            assert 'id="run-version-wait"' in page and _WAIT in page
            assert 'id="run-version-wait"' not in await (await client.get("/runs/o2-a-running")).text()

            redis_client.hset(f"{s.redis_prefix}:projection", "state", "rebuilding")
            html = await (await client.get("/versions")).text()
            assert 'id="versions-note"' in html and "marked &#39;rebuilding&#39;" in html
            assert [(v, n) for v, n, _, _ in _ROW.findall(html)] == [("orders@1", "0"), ("orders@2", "0"),
                                                                      ("orders@3", "0")]

    asyncio.run(go())
