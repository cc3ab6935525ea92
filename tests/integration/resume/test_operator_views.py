"""Views that answer an operator's questions (issue 16, item 5), against the real broker and Redis.

``runlog runs`` without a projector (from the log, said on stderr) and with one (from Redis);
why a run is blocked and the full delivery key of its open effect; ``runlog show`` telling
executed, reused and reconciled calls apart, and ``--payloads`` with credentials masked;
``runlog resume --dry-run`` asking for ``--app`` and finding app modules in the current directory.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from runlog.processors.cli import main
from runlog.processors.demo.run import wait_lease_gone
from runlog.processors.operate import resolve_effect
from runlog.processors.resume import Resumer
from runlog.producers import DictInputSource, Runner, Workflow, rule, tool
from runlog.schemas import EventType, Settings
from tests.integration.resume._orders import orders_app, spawn
from tests.integration.resume._toy import crash, toy, wait_events_topic_ready
from tests.integration.resume.conftest import DemoWorld, accepted, log_of, project

pytestmark = pytest.mark.integration

HEX64 = re.compile(r"\b[0-9a-f]{64}\b")


@pytest.fixture
def env(topics: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Settings:
    """The CLI (``runlog.processors.cli.main`` in this process) configured for this test's topics."""
    for k, v in topics.to_env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)
    wait_events_topic_ready(topics)
    return topics


def runlog(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def crash_orders(settings: Settings, world: DemoWorld, tmp: Path, *points: tuple[str, str]) -> list[str]:
    """One orders worker per ``(crash point, mode)``, all at once, each SIGKILLed at its point."""
    procs = [spawn(settings, world.url, key=None, order=f"o-{i}", mode=mode, crash_at=point)
             for i, (point, mode) in enumerate(points)]
    ids = []
    for (point, _), proc in zip(points, procs, strict=True):
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        (tmp / f"worker-{uuid.uuid4().hex[:6]}.log").write_text(out + err)
        assert proc.returncode == -9, f"worker for {point} exited {proc.returncode}:\n{out}{err}"
        ids.append(next(ln.split("=", 1)[1] for ln in out.splitlines() if ln.startswith("run_id=")))
    for run_id in ids:
        wait_lease_gone(settings, run_id, settings.lease_ttl_ms / 1000 * 4)
    return ids


def calls_of(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["call_id"]: c for c in doc["calls"]}


# -- runlog runs --------------------------------------------------------------------------------


def test_runs_without_a_projector_come_from_the_log_with_a_note_and_with_one_from_redis(
        env: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    t = toy("alpha")
    crashed = crash(env, t)
    finished = crash(env, t, q="y")
    wait_lease_gone(env, finished, env.lease_ttl_ms / 1000 * 4)
    with Resumer(env, t.app()) as r:
        assert r.resume(finished).result == "completed"

    rc, out, err = runlog(capsys, "runs", "--json")
    assert rc == 0
    assert "from the events topic" in err and "no projector" in err and len(err.strip().splitlines()) == 1
    rows = {d["run_id"]: d for d in json.loads(out)}
    assert rows[crashed]["status"] == "RUNNING" and rows[finished]["status"] == "COMPLETED"
    assert rows[crashed]["workflow"] == "alpha" and rows[crashed]["workflow_version"] == "1"
    assert rows[finished]["epoch"] == 2 and rows[finished]["reason"] is None
    rc, out, err = runlog(capsys, "runs", "--status", "running")
    assert rc == 0 and crashed in out and finished not in out and "alpha@1" in out

    project(env)
    later = crash(env, t, q="z")  # on the log, not projected: the list below comes from Redis
    rc, out, err = runlog(capsys, "runs", "--json")
    assert rc == 0 and err == ""
    assert {d["run_id"] for d in json.loads(out)} == {crashed, finished}
    assert later not in out


# -- a run blocked on a charge in doubt ---------------------------------------------------------


def test_a_blocked_run_shows_its_reason_and_the_full_delivery_key_of_its_open_effect(
        env: Settings, world: DemoWorld, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    [run_id] = crash_orders(env, world, tmp_path, ("inside:TOOL:pay/charge/0", "ctx"))
    with Resumer(env, orders_app(world.client)) as r:
        out = r.resume(run_id)
    assert out.result == "blocked", out
    intent = next(le.event for le in accepted(log_of(env, run_id)) if le.event.type is EventType.EFFECT_INTENT
                  and le.event.call_id == "pay/charge/0")
    dk = intent.delivery_key
    assert dk is not None and HEX64.fullmatch(dk)
    blocked = next(le.event for le in accepted(log_of(env, run_id)) if le.event.type is EventType.RUN_BLOCKED)
    assert blocked.error is not None

    rc, text, err = runlog(capsys, "runs", "--status", "BLOCKED")
    assert rc == 0 and "from the events topic" in err
    assert run_id in text and "orders@1" in text
    assert f"reason: {blocked.error.message}" in text
    assert f"open effect: charge pay/charge/0 [NEVER] delivery key {dk}" in text
    rc, js, _ = runlog(capsys, "runs", "--json", "--status", "BLOCKED")
    [row] = json.loads(js)
    assert row["run_id"] == run_id and row["status"] == "BLOCKED" and row["reason"] == blocked.error.message
    assert row["open_effects"] == [{"tool": "charge", "call_id": "pay/charge/0", "delivery_key": dk,
                                    "target": "payments:cards", "stage": "pay", "policy": "NEVER",
                                    "status": "INTENT"}]

    rc, shown, _ = runlog(capsys, "show", run_id)
    assert rc == 0
    assert f"reason: {blocked.error.message}" in shown
    line = next(ln for ln in shown.splitlines() if ln.lstrip().startswith("pay/charge/0 "))
    assert line.split()[1:4] == ["charge", "NEVER", "open"]
    assert f"delivery key {dk}" in shown and f"dk={dk}" in shown
    rc, js, _ = runlog(capsys, "show", run_id, "--json")
    doc = json.loads(js)
    assert doc["reason"] == blocked.error.message
    assert calls_of(doc)["pay/charge/0"]["delivery_key"] == dk
    assert calls_of(doc)["pay/charge/0"]["how"] == "open"
    assert [e["delivery_key"] for e in doc["effects"] if e["status"] == "INTENT"] == [dk]

    # the operator copies the key, resolves it, and the next resume hands the decision back
    resolve_effect(env, run_id, dk, done=True, external_id="ch-7", by="alice", reason="seen at the PSP")
    with Resumer(env, orders_app(world.client)) as r:
        done = r.resume(run_id)
    assert done.result == "completed", done
    rc, js, _ = runlog(capsys, "show", run_id, "--json")
    charge = calls_of(json.loads(js))["pay/charge/0"]
    assert (charge["how"], charge["external_id"], charge["reused_at"]) == ("resolved", "ch-7", [done.epoch])
    assert charge["detail"] == "done by alice (seen at the PSP)"
    rc, js, _ = runlog(capsys, "runs", "--json")
    rows = [(d["status"], d["reason"], d["open_effects"]) for d in json.loads(js)]
    assert rows == [("COMPLETED", None, [])]


# -- runlog show: how each result came to be ---------------------------------------------------


def test_show_tells_executed_reused_and_reconciled_calls_apart(
        env: Settings, world: DemoWorld, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    app = orders_app(world.client)
    reused, diverged, reconciled = crash_orders(
        env, world, tmp_path, ("before:VERIFIED:pick", "ctx"), ("before:VERIFIED:pick", "raw"),
        ("before:EFFECT_RESULT:notify/email/0", "ctx"))
    with Resumer(env, app) as r:
        assert r.resume(reused).result == "completed"
        assert r.resume(diverged).result == "blocked"
        assert r.resume(reconciled).result == "completed"

    _, js, _ = runlog(capsys, "show", reused, "--json")
    calls = calls_of(json.loads(js))
    # pick's calls (ctx.random() is one) were recorded at epoch 1; the resume re-ran pick, got
    # them back without appending anything, and went on
    assert calls["pick/runlog.random/0"]["how"] == "reused"
    assert calls["pick/quote/1"]["how"] == "reused" and calls["pick/quote/1"]["reused_at"] == [2]
    assert calls["pick/reserve/2"]["how"] == "reused" and calls["pick/reserve/2"]["external_id"]
    assert HEX64.fullmatch(calls["pick/reserve/2"]["delivery_key"])
    assert calls["pay/charge/0"]["how"] == "executed" and calls["pay/charge/0"]["epoch"] == 2
    assert calls["notify/email/0"]["how"] == "executed"
    _, text, _ = runlog(capsys, "show", reused)
    hows = {ln.split()[0]: ln.split()[3] for ln in text.split("\ncalls:\n", 1)[1].splitlines()
            if ln.startswith("  ") and not ln.startswith("      ")}
    assert hows == {"pick/runlog.random/0": "reused", "pick/quote/1": "reused", "pick/reserve/2": "reused",
                    "pay/charge/0": "executed", "notify/email/0": "executed"}

    # the resume re-entered pick but stopped at its first call: nothing after it was reused
    _, js, _ = runlog(capsys, "show", diverged, "--json")
    calls = calls_of(json.loads(js))
    assert calls["pick/quote/0"]["how"] == "diverged"
    assert calls["pick/reserve/1"]["how"] == "executed" and calls["pick/reserve/1"]["epoch"] == 1

    _, js, _ = runlog(capsys, "show", reconciled, "--json")
    doc = json.loads(js)
    email = calls_of(doc)["notify/email/0"]
    assert email["how"] == "reconciled" and email["epoch"] == 2
    assert email["external_id"] and HEX64.fullmatch(email["delivery_key"])
    assert calls_of(doc)["pay/charge/0"]["how"] == "executed"
    assert world.stats()["charges"] == 2  # reused and reconciled runs charged once each; diverged never


def test_show_payloads_prints_arguments_and_results_with_credentials_masked(
        env: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    @tool("login")
    def login(call: Any, user: str, password: str, notes: str) -> dict[str, Any]:
        return {"session_token": "tok-SECRET-123", "greeting": f"hello {user}",
                "link": "https://alice:hunter2@example.com/x", "essay": "z" * 5000, "tokens_used": 17}

    wf = Workflow("secretive", "1")

    @wf.stage("auth", rules=[rule("ok", lambda o: bool(o["greeting"]))])
    def auth(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return dict(ctx.call(login, user="alice", password="hunter2",
                             notes="use Bearer abcdefghijklmnop0123 and api_key=sk-abcdefghijklmnopqrstu"))

    runner = Runner.from_settings(env, source=DictInputSource({}))
    try:
        h = runner.start_run(wf, {"customer": "c-9", "api_token": "params-SECRET-9"})
        assert h.session is not None
        assert runner.execute(h.session).completed
    finally:
        runner.close()

    rc, text, _ = runlog(capsys, "show", h.run_id, "--payloads")
    assert rc == 0
    for secret in ("hunter2", "tok-SECRET-123", "abcdefghijklmnop0123", "sk-abcdefghijklmnopqrstu",
                   "params-SECRET-9"):
        assert secret not in text, secret
    assert '"user": "alice"' in text and '"password": "[redacted]"' in text
    assert '"session_token": "[redacted]"' in text and '"tokens_used": 17' in text
    assert "https://alice:[redacted]@example.com/x" in text and '"customer": "c-9"' in text
    assert "… (5000 chars)" in text and "z" * 5000 not in text
    assert re.search(r"auth/login/0\s+login\s+SAFE\s+executed", text)

    rc, js, _ = runlog(capsys, "show", h.run_id, "--payloads", "--json")
    doc = json.loads(js)
    call = calls_of(doc)["auth/login/0"]
    assert call["args_payload"]["user"] == "alice" and call["args_payload"]["password"] == "[redacted]"
    assert call["result_payload"]["session_token"] == "[redacted]"
    assert doc["params"] == {"customer": "c-9", "api_token": "[redacted]"}
    assert "hunter2" not in js and "params-SECRET-9" not in js
    rc, js, _ = runlog(capsys, "show", h.run_id, "--json")
    assert "args_payload" not in js and "hello alice" not in js  # payloads only on request


# -- runlog resume --dry-run --app ----------------------------------------------------------------


def test_resume_dry_run_asks_for_the_app_and_finds_app_modules_in_the_current_directory(
        env: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    run_id = crash(env, toy("alpha"))

    rc, out, err = runlog(capsys, "resume", run_id, "--dry-run")
    assert rc == 2 and out == ""
    assert "pass --app module:attribute" in err and "would block" not in err

    name = f"opsapp_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        "from tests.integration.resume._toy import toy\n\napp = toy('alpha').app()\n")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, name, raising=False)
    rc, out, err = runlog(capsys, "resume", run_id, "--dry-run", "--app", f"{name}:app")
    assert rc == 0, err
    assert f"run {run_id} (RUNNING)" in out and "continue from: finish" in out
