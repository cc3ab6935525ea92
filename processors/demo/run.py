"""``runlog demo``: the seed's story, for real. A run crashes while uploading the cover;
the resumer group continues it; a receipt compares it with an uncrashed run.

Each run gets its own demo world (search, renderer, assets, platform with their
own SQLite files) so what each run caused outside is counted separately. The
workers are real subprocesses killed with SIGKILL by the fault hook; the resume
goes through the resume topic and a resumer consumer, like in production.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from processors.admin import ensure_topics
from processors.demo.client import WorldClient
from processors.demo.pipeline import build, charge_workflow, source
from processors.demo.world import serve
from processors.inspect import render_timeline, run_history
from processors.resume import App, ResumeOutcome
from processors.resumer import ResumerService, request_resume
from schemas import ConfigError, EventType, RunlogError, Settings

__all__ = ["DEFAULT_CRASH_AT", "DemoFailed", "run_demo"]

DEFAULT_CRASH_AT = "before:EFFECT_RESULT:visual/upload/5"
"""While uploading the cover: the asset store has it, the log has only the intent."""

_FIGURES = ("publishes", "renders_billed", "research_calls", "uploads", "assets")


class DemoFailed(RunlogError):
    """The demo could not show what it shows (a worker misbehaved, a resume did not finish)."""


def _say(quiet: bool, text: str) -> None:
    if not quiet:
        print(text, file=sys.stderr, flush=True)


def _worker(settings: Settings, world_url: str, crash_at: str | None, workdir: Path,
            params: str) -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items() if k != "RUNLOG_CRASH_AT"}
    env.update({
        "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap_servers,
        "REDIS_URL": settings.redis_url,
        "RUNLOG_TOPIC_PREFIX": settings.topic_prefix,
        "RUNLOG_REDIS_PREFIX": settings.redis_prefix,
        "RUNLOG_ARTIFACT_ROOT": settings.artifact_root,
        "RUNLOG_LEASE_TTL_MS": str(settings.lease_ttl_ms),
        "RUNLOG_DEMO_WORLD_URL": world_url,
    })
    if crash_at:
        env["RUNLOG_CRASH_AT"] = crash_at
    proc = subprocess.run([sys.executable, "-m", "processors.demo.worker", "--params", params],
                          env=env, capture_output=True, text=True, timeout=300, check=False,
                          cwd=os.getcwd())
    (workdir / ("worker-crashed.log" if crash_at else "worker-reference.log")).write_text(
        proc.stdout + proc.stderr)
    run_id = next((line.split("=", 1)[1] for line in proc.stdout.splitlines()
                   if line.startswith("run_id=")), None)
    if run_id is None:
        raise DemoFailed(f"the worker printed no run id (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return run_id, proc.returncode


def _wait_lease_gone(settings: Settings, run_id: str, timeout_s: float) -> float:
    client = redis.Redis.from_url(settings.redis_url, **settings.redis_kwargs())
    key = f"{settings.redis_prefix}:{{{run_id}}}:lease"
    t0 = time.monotonic()
    try:
        while client.exists(key):
            if time.monotonic() - t0 > timeout_s:
                raise DemoFailed(f"the dead worker's lease on {run_id} did not expire in {timeout_s:.0f}s")
            time.sleep(0.1)
    finally:
        client.close()
    return time.monotonic() - t0


def _final_hashes(settings: Settings, run_id: str) -> tuple[dict[str, str], list[Any]]:
    history = run_history(settings, run_id)
    if not history:
        raise DemoFailed(f"no events for {run_id} on the log")
    state = history[-1].state
    return {stage: ref.sha256 for stage, ref in sorted(state.stage_outputs.items())}, history


def run_demo(settings: Settings, *, crash_at: str = DEFAULT_CRASH_AT, workdir: Path | None = None,
             quiet: bool = False, params: str = '{"seed": 7}') -> dict[str, Any]:
    """Run the reference and the crashed run, resume the crashed one, and compare them."""
    if settings.lease_ttl_ms > 10_000:
        settings = settings.with_(lease_ttl_ms=3000)  # a dead worker's lease expires fast in the demo
    tag = uuid.uuid4().hex[:8]
    base = workdir or Path(".runlog") / "demo" / f"{time.strftime('%Y%m%d-%H%M%S')}-{tag}"
    base.mkdir(parents=True, exist_ok=True)
    reports = ensure_topics(settings)
    bad = [r for r in reports if r.action not in ("ok", "created")]
    if bad:
        raise ConfigError("topics conflict with Runlog's settings: run `runlog init` for details")
    servers = {name: serve(base / name) for name in ("reference", "crashed")}
    urls = {name: f"http://127.0.0.1:{s.server_address[1]}" for name, s in servers.items()}
    try:
        _say(quiet, f"demo: worlds in {base} (reference {urls['reference']}, crashed {urls['crashed']})")
        ref_id, rc = _worker(settings, urls["reference"], None, base, params)
        if rc != 0:
            raise DemoFailed(f"the reference run {ref_id} did not complete (exit {rc})")
        _say(quiet, f"demo: reference run {ref_id} completed")
        crash_id, rc = _worker(settings, urls["crashed"], crash_at, base, params)
        if rc != -9:
            raise DemoFailed(f"the crash point {crash_at!r} was never reached (worker exit {rc})")
        _say(quiet, f"demo: run {crash_id} killed with SIGKILL at {crash_at}")
        waited = _wait_lease_gone(settings, crash_id, settings.lease_ttl_ms / 1000 * 3)
        _say(quiet, f"demo: its lease expired after {waited:.1f}s; requesting resume")
        world = WorldClient(urls["crashed"])
        wf, tools = build(world)
        checkout, charge = charge_workflow(world)
        app = App.of([wf, checkout], [*tools, charge], source())
        t0 = time.monotonic()
        request_resume(settings, crash_id, "demo: worker crashed", requested_by="demo")
        done: list[ResumeOutcome] = []
        with ResumerService(settings.with_(resumer_group="runlog-demo-resumer", sweep_interval_ms=0),
                            app, accept=lambda rid: rid == crash_id,
                            on_outcome=done.append) as service:
            deadline = time.monotonic() + 120
            while not done and time.monotonic() < deadline:
                service.poll_once(0.5)
        if not done:
            raise DemoFailed(f"the resumer did not pick up the request for {crash_id} in 120s")
        outcome = done[-1]
        resume_s = time.monotonic() - t0
        _say(quiet, f"demo: resume {outcome.result} in {resume_s:.1f}s (epoch {outcome.epoch})")
        ref_hashes, _ = _final_hashes(settings, ref_id)
        crash_hashes, history = _final_hashes(settings, crash_id)
        ref_stats = WorldClient(urls["reference"]).stats()
        crash_stats = world.stats()
    finally:
        for s in servers.values():
            s.shutdown()
            s.server_close()
    state = history[-1].state
    result: dict[str, Any] = {
        "run_id": crash_id,
        "completed": state.status.value == "COMPLETED",
        "crashed_at": crash_at,
        "resume": outcome.result,
        "resume_seconds": round(resume_s, 3),
        "checkpoint_resumed_from": outcome.plan.checkpoint.checkpoint_id if outcome.plan.checkpoint else None,
        "events_read_on_resume": outcome.plan.events_read,
        "reused_calls": sorted(outcome.plan.reused_calls),
        "effects_on_resume": [e.action for e in outcome.plan.effects],
        "epochs": sorted({le.event.epoch for le in history}),
        "artifacts_equal_reference": crash_hashes == ref_hashes,
        "final_artifacts": crash_hashes,
        **{k: crash_stats[k] for k in _FIGURES},
        "reference": {"run_id": ref_id, **{k: ref_stats[k] for k in _FIGURES},
                      "final_artifacts": ref_hashes},
        "timeline": render_timeline(history),
        "workdir": str(base),
    }
    if not quiet:
        lease_changes = sum(1 for le in history if le.event.type is EventType.LEASE_ACQUIRED)
        result["lease_changes"] = lease_changes
    return result


def format_receipt(r: dict[str, Any]) -> str:
    """The human-readable receipt: timeline, then the figures side by side."""
    ref = r["reference"]
    rows = [("articles published", "publishes"), ("renders billed", "renders_billed"),
            ("research calls", "research_calls"), ("upload requests", "uploads"),
            ("assets stored", "assets")]
    out = [f"Run {r['run_id']} (crashed at {r['crashed_at']}, resumed: {r['resume']})", "",
           r["timeline"], "",
           f"Resumed from checkpoint {r['checkpoint_resumed_from']} reading {r['events_read_on_resume']}"
           f" events; reused {len(r['reused_calls'])} recorded tool results; open effects: "
           f"{', '.join(r['effects_on_resume']) or 'none'}", "",
           f"{'receipt':<22}{'crashed+resumed':>16}{'uncrashed':>11}"]
    for label, key in rows:
        out.append(f"{label:<22}{r[key]:>16}{ref[key]:>11}")
    out.append(f"{'final artifacts equal':<22}{'yes' if r['artifacts_equal_reference'] else 'NO':>16}")
    out.append(f"{'completed':<22}{'yes' if r['completed'] else 'NO':>16}")
    return "\n".join(out)
