"""An upgrade is an operator event the run's page, ``runlog show`` and the audit display: who, why,
from which version to which, the checkpoint kept and the stages re-run (issue #25 item 2).

What each test would catch: a RUN_UPGRADED shown without its versions, checkpoint or stages, or
not among what people did."""

from __future__ import annotations

import asyncio
import html as html_lib
import re
from pathlib import Path

import pytest

from runlog.processors.audit import AuditOptions, audit
from runlog.processors.cli import main
from runlog.processors.demo.run import wait_lease_gone
from runlog.processors.upgrade import upgrade_run
from runlog.schemas import Settings
from tests.integration.console.conftest import console, project
from tests.integration.resume._orders import orders_app
from tests.integration.resume.conftest import DemoWorld
from tests.integration.resume.test_upgrade import _crash_at, _start_crashed

pytestmark = pytest.mark.integration


def test_the_run_page_show_and_the_audit_say_what_an_upgrade_kept_and_re_ran(
        console_settings: Settings, world: DemoWorld, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    s = console_settings
    run_id = _start_crashed(s, orders_app(world.client, crash=_crash_at("notify")), "shown")
    wait_lease_gone(s, run_id, 10)
    res = upgrade_run(s, orders_app(world.client, versions=("1", "2")), run_id, "2", by="ops-ana",
                      reason="thank the customer")
    assert res.outcome is not None and res.outcome.result == "completed"
    cp = res.plan.checkpoint_id
    assert cp
    want = f"upgrade 1 -> 2 from checkpoint {cp} (kept pick, pay; re-runs notify)"

    for k, v in s.to_env().items():
        monkeypatch.setenv(k, v)
    capsys.readouterr()
    assert main(["show", run_id]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "RUN_UPGRADED" in ln)
    assert want in line and "by=ops-ana" in line and "reason=thank the customer" in line, line

    report = audit(s, AuditOptions(run_id=run_id, check_artifacts=False), progress=None)
    acts = report.runs[run_id].to_dict()["operator_actions"]
    upgraded = [a for a in acts if a["type"] == "RUN_UPGRADED"]
    assert len(upgraded) == 1, acts
    assert (upgraded[0]["action"], upgraded[0]["by"], upgraded[0]["why"]) == (want, "ops-ana",
                                                                                "thank the customer")

    project(s)

    async def go() -> None:
        async with console(s) as client:
            page = await (await client.get(f"/runs/{run_id}")).text()
            people = page.split("What people did", 1)[1].split("</table>", 1)[0]
            row = re.search(r'<tr class="person".*?RUN_UPGRADED.*?</tr>', people, re.S)
            assert row is not None, people
            text = html_lib.unescape(row.group(0))
            assert want in text and "ops-ana" in text and "thank the customer" in text, text

    asyncio.run(go())
