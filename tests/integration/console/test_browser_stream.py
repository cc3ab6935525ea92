"""A run's streamed output drawn by the console page in a real headless Chromium.

A run's page is open while its stream grows on the real streams topic: a first attempt of a model
call that died after two deltas, a second attempt that supersedes it and finishes, a tool call,
then (with the page still open, never reloaded) a new call's deltas. Would catch: a page that does
not open the stream, text drawn twice or out of order, the superseded attempt not marked, a tool
call not shown, records written after the page opened not drawn.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from runlog.producers import DictInputSource, Runner, StageContext, Workflow
from runlog.producers.streams import StreamWriter
from runlog.schemas import Settings
from tests.conftest import require
from tests.integration.console._cdp import Browser, chromium_path
from tests.integration.console.conftest import console, origin, project

pytestmark = pytest.mark.integration


def _finished_run(settings: Settings) -> str:
    wf = Workflow("streamed", "1")

    @wf.stage("answer")
    def answer(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True}

    with Runner.from_settings(settings, source=DictInputSource({})) as runner:
        res = runner.run(wf, {})
    assert res.completed
    return res.run_id


def test_in_chromium_the_run_page_draws_its_streamed_output_and_marks_a_superseded_attempt(
        console_settings: Settings, tmp_path: Path) -> None:
    binary = chromium_path()
    require(binary is not None, "no chromium binary on PATH (Debian package `chromium`; deploy/env.sh "
            "installs it)")
    assert binary is not None
    s = console_settings
    run_id = _finished_run(s)
    project(s)
    writer = StreamWriter.from_settings(s)
    model, lookup = "answer/pydantic_ai.model.talk/0", "answer/pydantic_ai.tool.talk.lookup/1"
    first = writer.begin(run_id=run_id, stage="answer", call_id=model, epoch=1, attempt=1, supersedes=False)
    first.delta(0, "Hel")
    first.delta(0, "lo wo")  # then the process died
    second = writer.begin(run_id=run_id, stage="answer", call_id=model, epoch=2, attempt=1, supersedes=True)
    for chunk in ("Hel", "lo ", "world"):
        second.delta(0, chunk)
    second.final('{"parts":[]}')
    tool = writer.begin(run_id=run_id, stage="answer", call_id=lookup, epoch=2, attempt=1, supersedes=False)
    tool.event(json.dumps({"event_kind": "function_tool_call",
                           "part": {"tool_name": "lookup", "args": {"city": "Oslo"}, "tool_call_id": "t1"}}))
    tool.final('"sunny in Oslo"')
    assert writer.flush(30) == 0

    async def go() -> None:
        async with console(s) as client, Browser(binary, tmp_path / "chromium") as b:
            await b.navigate(origin(client) + f"/runs/{run_id}")
            await b.wait_for("!document.getElementById('run-stream').hidden && "
                             "document.querySelectorAll('#stream-calls li.attempt.final').length === 2",
                             what="the streamed output drawn")
            await b.evaluate("window.__sameDocument = 'yes'")
            drawn = await b.evaluate(
                "Array.from(document.querySelectorAll('#stream-calls li.attempt')).map(li => "
                "[li.dataset.call, li.dataset.attempt, li.querySelector('pre.text').textContent, "
                "li.classList.contains('superseded'), li.classList.contains('final'), "
                "li.querySelector('ul.events').textContent])")
            assert drawn == [
                [model, "1.1", "Hello wo", True, False, ""],
                [model, "2.1", "Hello world", False, True, ""],
                [lookup, "2.1", "", False, True, 'tool lookup({"city":"Oslo"})'],
            ], drawn
            assert await b.evaluate("document.getElementById('stream-state').textContent") == "live"

            later = writer.begin(run_id=run_id, stage="answer", call_id="answer/pydantic_ai.model.talk/2",
                                 epoch=2, attempt=1, supersedes=False)
            for chunk in ("It is ", "sunny."):
                later.delta(0, chunk)
            assert writer.flush(30) == 0
            await b.wait_for("Array.from(document.querySelectorAll('#stream-calls pre.text'))"
                             ".some(p => p.textContent === 'It is sunny.')", what="a later call drawn live")
            assert await b.evaluate("window.__sameDocument") == "yes", "the page was reloaded"

    asyncio.run(go())
