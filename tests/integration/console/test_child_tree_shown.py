"""The console draws a run's family: a parent's page lists its child runs as a tree (each linked, with
its workflow, status, the parent's call that started it and what it spent), the parent's usage says
which part is its own and which its children's, and a child's page links its parent. The run is the
OpenAI Agents SDK handoff of tests/integration/resume/_handoff_agents.py (a triage agent handing off
to a researcher run as a child run).

What it would catch: the tree missing from the page, a child not linked, a child's spend counted
twice in the parent's total, or the parent link missing on the child's page."""

from __future__ import annotations

import asyncio
import html as html_lib
from pathlib import Path

import pytest

from runlog.processors.resume import Resumer
from runlog.producers import Runner
from runlog.schemas import Settings
from tests.integration.console.conftest import console, project
from tests.integration.resume._handoff_agents import app

pytestmark = pytest.mark.integration


def test_a_parents_page_draws_its_child_runs_and_a_childs_page_its_parent(console_settings: Settings,
                                                                           tmp_path: Path) -> None:
    s = console_settings
    application = app("openai_agents", tmp_path / "world")
    with Runner.from_settings(s, source=application.source, prices=application.prices) as runner:
        handle = runner.start_run(application.registry.get("ho-oa"), {"sku": "sku-1"})
        assert handle.session is not None
        assert runner.execute(handle.session).waiting == "runlog.child"
    parent_id = handle.run_id
    child_id = _child_of(s, parent_id)
    with Resumer(s, application) as r:
        assert r.resume(child_id).result == "completed"
        assert r.resume(parent_id).result == "completed"
    project(s)

    async def go() -> None:
        async with console(s) as client:
            page = html_lib.unescape(await (await client.get(f"/runs/{parent_id}")).text())
            children = page.split('id="run-children"', 1)[1].split("</section>", 1)[0]
            assert f'<a href="/runs/{child_id}">{child_id}</a>' in children
            assert "openai_agents.agent.researcher@1" in children and "COMPLETED" in children
            assert "ask/runlog.child/1" in children
            assert "usage 200 in / 20 out over 2 calls" in children
            usage = page.split('id="run-usage"', 1)[1].split("</td>", 1)[0]
            assert usage.startswith(">300 in / 30 out over 3 calls")  # the child's once, not twice
            assert "own: 100 in / 10 out over 1 call" in usage
            assert "children (1 ended, recorded with their outcomes): 200 in / 20 out over 2 calls" in usage
            assert "with its children: 300 in / 30 out over 3 calls" in page

            child = html_lib.unescape(await (await client.get(f"/runs/{child_id}")).text())
            assert f'child of <a href="/runs/{parent_id}">{parent_id}</a> (ask/runlog.child/1)' in child

    asyncio.run(go())


def _child_of(s: Settings, parent_id: str) -> str:
    from runlog.processors.inspect import run_history

    return next(le.event.attributes["runlog.child_run_id"] for le in run_history(s, parent_id)
                if le.event.tool == "runlog.child" and le.event.type.value == "TOOL_CALLED")
