"""The console shows what runs spent: the run list's tokens and cost columns (and ``/api/runs``), a
run's page and ``/api/runs/<id>`` its model usage in all, by stage and by model, and a branch's
inherited spend apart from its own (the two-agent workflow of
tests/integration/resume/_usage_agent.py, priced by its App).

What it would catch: usage missing from the list, the page or the JSON, a cost shown for the model
without a price, a branch's inherited spend mixed into its own."""

from __future__ import annotations

import asyncio
import html as html_lib

import pytest

from runlog.processors.branch import branch_run
from runlog.producers import Runner
from runlog.schemas import Settings
from tests.integration.console.conftest import console, project
from tests.integration.resume._usage_agent import FREE, PRICED, WORKFLOW, usage_app

pytestmark = pytest.mark.integration


def test_the_run_list_and_pages_show_tokens_and_cost_and_a_branch_apart(console_settings: Settings) -> None:
    s = console_settings
    app = usage_app()
    with Runner.from_settings(s, source=app.source, prices=app.prices) as runner:
        parent = runner.run(app.registry.get(WORKFLOW), {})
    assert parent.completed
    branch = branch_run(s, app, parent.run_id, {"style": "v2"})
    assert branch.completed
    project(s)

    async def go() -> None:
        async with console(s) as client:
            listed = await (await client.get("/api/runs")).json()
            rows = {r["run_id"]: r for r in listed["runs"]}
            p, b = rows[parent.run_id], rows[branch.run_id]
            assert p["tokens"] == b["tokens"] == 4600 + 166 + 500 + 200  # research + write, all of it
            assert p["cost_usd"] == b["cost_usd"] == pytest.approx(0.009178)  # the priced model only
            assert "1 without a price" in p["usage"]
            part = html_lib.unescape(await (await client.get("/runs")).text())
            assert "<th>tokens</th><th>cost</th>" in part and "$0.0092" in part and "5,466" in part

            page = html_lib.unescape(await (await client.get(f"/runs/{branch.run_id}")).text())
            usage = page.split('id="run-usage"', 1)[1].split("</td>", 1)[0]
            assert f"inherited from {parent.run_id}" in usage and "4,600 in (900 cached)" in usage
            assert "this branch: 500 in / 200 out over 1 call, 1 without a price" in usage
            assert f"model {FREE}: 500 in / 200 out over 1 call, 1 without a price" in usage
            assert f"model {PRICED}" not in usage  # the branch's own calls only: research was inherited

            doc = await (await client.get(f"/api/runs/{parent.run_id}")).json()
            assert doc["usage"]["models"][PRICED]["cost_nanos"] == 9_178_000
            assert doc["usage"]["models"][FREE]["cost_nanos"] is None
            assert doc["usage"]["models"][FREE]["input_tokens"] == 500

    asyncio.run(go())
