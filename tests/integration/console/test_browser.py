"""The console in a real headless Chromium (the system's ``chromium``, driven over DevTools).

An order run is killed inside its card charge (a ``NEVER`` effect), resumed, and blocks: the
charge is in doubt. In the browser, a person opens the console, finds the run among those that
need a person, opens it, is refused without the token (a request from the page without it, and
the form with a wrong one: nothing appended), then resolves the charge as not done with the
token. The resolve asks for a resume; the resumer group continues the run, the tool charges
once, and the page, never reloaded, shows ``EFFECT_RESOLVED`` through ``RUN_COMPLETED`` as they
arrive. Would catch: the blocked run missing from the list, a button that does not reach the
CLI's resolve, an action taken without the token, a page that needs a reload to show events.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import uuid
from pathlib import Path

import pytest

from runlog.processors.demo.run import wait_lease_gone
from runlog.processors.inspect import run_history
from runlog.processors.resume import Resumer, ResumerService
from runlog.projections import OutcomeKind
from runlog.schemas import EventType, Settings
from tests.conftest import require
from tests.integration.console._cdp import Browser, chromium_path
from tests.integration.console.conftest import TOKEN, console, log_size, origin, project
from tests.integration.resume._orders import orders_app, spawn
from tests.integration.resume.conftest import DemoWorld

pytestmark = pytest.mark.integration


def _blocked_order(settings: Settings, world: DemoWorld, logs: Path) -> str:
    """An order run killed inside its charge, then resumed: blocked on the in-doubt charge."""
    proc = spawn(settings, world.url, key=None, crash_at="inside:TOOL:pay/charge/0")
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    (logs / "worker.log").write_text(out + err)
    assert proc.returncode == -9, f"the worker was not killed at its charge:\n{out}\n{err}"
    run_id = next(ln.split("=", 1)[1] for ln in out.splitlines() if ln.startswith("run_id="))
    wait_lease_gone(settings, run_id, settings.lease_ttl_ms / 1000 * 4)
    with Resumer(settings, orders_app(world.client)) as r:
        outcome = r.resume(run_id)
    assert outcome.result == "blocked" and "a person must check" in outcome.detail, outcome
    return run_id


def test_in_chromium_the_resolve_button_unblocks_a_run_and_the_page_shows_it_complete_without_a_reload(
        console_settings: Settings, world: DemoWorld, tmp_path: Path) -> None:
    binary = chromium_path()
    require(binary is not None, "no chromium binary on PATH (Debian package `chromium`; deploy/env.sh "
            "installs it)")
    assert binary is not None
    # no sweep: only the resume the resolve requests can continue the run
    s = console_settings.with_(resumer_group=f"t-{uuid.uuid4().hex[:8]}-resumer", sweep_interval_ms=0)
    app = orders_app(world.client)
    run_id = _blocked_order(s, world, tmp_path)
    project(s)  # the list is the projection's
    assert world.stats()["charges"] == 0

    stop = threading.Event()
    service = ResumerService(s, app)
    resumer = threading.Thread(target=lambda: service.serve(stop=stop.is_set), daemon=True)
    resumer.start()

    async def go() -> None:
        async with console(s, app=app) as client, Browser(binary, tmp_path / "chromium") as b:
            await b.navigate(origin(client) + "/")
            row = f'section.attention tr[data-run="{run_id}"]'
            await b.wait_for(f"!!document.querySelector('{row}[data-status=\"BLOCKED\"]')",
                             what="the blocked run among those needing a person")
            await b.click(f"{row} a.button")
            await b.wait_for(f"location.pathname === '/runs/{run_id}' && document.readyState === 'complete'",
                             what="the run's page")
            await b.wait_for("document.getElementById('live-state').textContent === 'live'",
                             what="the live stream")
            await b.evaluate("window.__sameDocument = 'yes'")
            key = await b.evaluate("document.querySelector('form.resolve').dataset.key")
            size = log_size(s)

            # a request from the page without the token is refused
            fields = {"key": key, "outcome": "not_done", "by": "ops-alice", "reason": "no charge seen"}
            answer = await b.evaluate(
                "fetch(location.pathname + '/resolve', {method: 'POST', headers: {"
                "'Accept': 'application/json',"
                " 'X-CSRF-Token': document.querySelector('meta[name=\"csrf-token\"]').content},"
                f" body: new URLSearchParams({json.dumps(fields)})}})"
                ".then(async r => [r.status, (await r.json()).message])")
            assert answer == [403, "the console token is required for every action"], answer

            form = f'form.resolve[data-key="{key}"]'
            await b.click(f'{form} input[value="not_done"]')
            await b.type(f'{form} input[name="by"]', "ops-alice")
            await b.type(f'{form} input[name="reason"]', "the payment provider has no charge for o-1")
            await b.type(f'{form} input[name="token"]', "not-the-token")
            await b.click(f'{form} button[type="submit"]')
            await b.wait_for("document.getElementById('flash').textContent.includes('wrong console token')",
                             what="the wrong token refused")
            assert log_size(s) == size, "a refused resolve appended something"
            assert await b.evaluate("document.getElementById('run-status').dataset.status") == "BLOCKED"

            await b.type(f'{form} input[name="token"]', TOKEN)
            await b.click(f'{form} button[type="submit"]')
            await b.wait_for("document.getElementById('flash').textContent.includes('resolved not_done')",
                             what="the resolve's answer")
            await b.wait_for("!!document.querySelector('li.event[data-type=\"RUN_COMPLETED\"]')", timeout=60,
                             what="RUN_COMPLETED drawn live")
            assert await b.evaluate("window.__sameDocument") == "yes", "the page was reloaded"
            assert await b.evaluate("document.getElementById('run-status').dataset.status") == "COMPLETED"
            resolved = await b.evaluate(
                "document.querySelector('li.event[data-type=\"EFFECT_RESOLVED\"]').textContent")
            assert "not_done by ops-alice (the payment provider has no charge for o-1)" in resolved, resolved
            people = await b.evaluate("document.getElementById('run-people').textContent")
            assert "ops-alice" in people and "resolve" in people, people
            assert await b.evaluate("document.querySelectorAll('li.event.new').length") > 0

    try:
        asyncio.run(go())
    finally:
        stop.set()
        resumer.join(30)
        service.close()
    assert world.stats()["charges"] == 1  # not done, so the resume charged exactly once
    accepted = [h.event for h in run_history(s, run_id) if h.outcome.kind is OutcomeKind.ACCEPTED]
    resolved = [e for e in accepted if e.type is EventType.EFFECT_RESOLVED]
    assert [(e.attributes["by"], e.attributes["decision"]) for e in resolved] == [("ops-alice", "not_done")]
    assert accepted[-1].type is EventType.RUN_COMPLETED
