"""``runlog demo``: the seed's story, for real. A run crashes while uploading the cover;
the resumer group continues it; a receipt compares it with an uncrashed run.

Each run gets its own demo world (search, renderer, assets, platform with their
own SQLite files) so what each run caused outside is counted separately. The
workers are real subprocesses killed with SIGKILL by the fault hook; the resume
goes through the resume topic and a resumer consumer, like in production.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runlog.processors.admin import check_redis, ensure_topics
from runlog.processors.demo.client import WorldClient
from runlog.processors.demo.pipeline import app_for
from runlog.processors.demo.world import serve
from runlog.processors.inspect import render_timeline, run_history
from runlog.processors.resume import ResumeOutcome, ResumerService, request_resume
from runlog.producers.crash import ENV as CRASH_ENV
from runlog.producers.internal import lease_key
from runlog.schemas import ConfigError, EventType, RunlogError, Settings
from runlog.schemas.internal import redis_client

log = logging.getLogger("runlog.demo")

__all__ = ["DEFAULT_CRASH_AT", "DemoFailed", "last_line", "run_demo", "spawn_worker", "wait_lease_gone",
           "wait_worker", "worker_env", "write_private"]

_ROOT = str(Path(__file__).resolve().parents[2])

DEFAULT_CRASH_AT = "before:EFFECT_RESULT:visual/upload/5"
"""While uploading the cover: the asset store has it, the log has only the intent."""

_FIGURES = ("publishes", "renders_billed", "research_calls", "uploads", "assets")


class DemoFailed(RunlogError):
    """The demo could not show what it shows (a worker misbehaved, a resume did not finish)."""


def _say(quiet: bool, text: str) -> None:
    if not quiet:
        print(text, file=sys.stderr, flush=True)


def _drop_group(settings: Settings, group: str) -> None:
    """Delete a consumer group this process made for itself and has left (best effort: a warning)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(settings.admin_config())
    for attempt in range(10):  # the broker may not have processed this process's leave yet
        try:
            for fut in admin.delete_consumer_groups([group], request_timeout=15).values():
                fut.result(30)
            return
        except Exception as err:  # noqa: BLE001 - leaving an empty group behind is not a demo failure
            if "GROUP_ID_NOT_FOUND" in str(err):
                return  # gone already
            if attempt == 9:
                log.warning("demo: could not delete its consumer group %s: %s", group, err)
                return
            time.sleep(0.5 * (attempt + 1))


def worker_env(settings: Settings, world_url: str, crash_at: str | None = None) -> dict[str, str]:
    """The environment of a demo worker process: exactly ``settings``, plus the world and crash point."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNLOG_")}
    env.update(settings.with_(demo_world_url=world_url).to_env())
    if crash_at:
        env[CRASH_ENV] = crash_at  # armed by the worker's entry point, not through Settings
    # the worker imports this package: make it importable from any working directory
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH", "")) if p)
    return env


def spawn_worker(settings: Settings, world_url: str, crash_at: str | None = None, *,
                 workflow: str = "content", params: str = '{"seed": 7}',
                 inputs: Mapping[str, str] | None = None, sdk: str = "sync") -> subprocess.Popen[str]:
    """Start a demo worker process (one run of ``workflow``); it prints ``run_id=...`` first.
    ``sdk="async"``: the worker runs the AsyncRunner on an asyncio loop."""
    cmd = [sys.executable, "-m", "runlog.processors.demo.worker", "--sdk", sdk, "--workflow", workflow,
           "--params", params]
    for k, v in (inputs or {}).items():
        cmd += ["--input", f"{k}={v}"]
    return subprocess.Popen(cmd, env=worker_env(settings, world_url, crash_at), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_worker(proc: subprocess.Popen[str], log: Path | None = None,
                timeout_s: float = 300) -> tuple[str, int]:
    """Wait for a worker; returns its run id and exit code (-9: it was killed at its crash point)."""
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    if log is not None:
        write_private(log, out + err)
    run_id = next((line.split("=", 1)[1] for line in out.splitlines() if line.startswith("run_id=")), None)
    if run_id is None:
        where = f" (its output: {log})" if log is not None else ""
        raise DemoFailed(f"the worker printed no run id (exit {proc.returncode}): {last_line(err)}{where}")
    return run_id, proc.returncode


def last_line(text: str) -> str:
    """The last non-blank line of a worker's stderr: the error a traceback ends with, not the traceback."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "(nothing on stderr)"


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (0600): the demo's files hold prompts and
    results."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def wait_lease_gone(settings: Settings, run_id: str, timeout_s: float) -> float:
    """Wait until the run's lease key is gone from Redis (its holder died and the ttl passed)."""
    return _wait_lease_gone(settings, run_id, timeout_s)


def _wait_lease_gone(settings: Settings, run_id: str, timeout_s: float) -> float:
    client = redis_client(settings)
    key = lease_key(settings.redis_prefix, run_id)
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
             quiet: bool = False, params: str = '{"seed": 7}', sdk: str = "sync") -> dict[str, Any]:
    """Run the reference and the crashed run, resume the crashed one, and compare them.
    ``sdk``: the workers run the ``Runner`` (``sync``) or the ``AsyncRunner`` (``async``)."""
    if settings.lease_ttl_ms > 10_000:
        settings = settings.with_(lease_ttl_ms=3000)  # a dead worker's lease expires fast in the demo
    if settings.schema_registry_url:
        from runlog.schemas import Codec

        Codec.from_settings(settings)  # an unreachable registry: one line and exit 2, before any worker
    check_redis(settings)  # a redis:// URL to a cluster node, an untrusted TLS server: one line, no worker
    tag = uuid.uuid4().hex[:8]
    base = workdir or Path(".runlog") / "demo" / f"{time.strftime('%Y%m%d-%H%M%S')}-{tag}"
    base.mkdir(parents=True, exist_ok=True)
    base.chmod(0o700)  # the worlds' files and the workers' logs hold prompts and results: owner only
    reports = ensure_topics(settings)
    bad = [r for r in reports if r.action not in ("ok", "created")]
    if bad:
        raise ConfigError("topics conflict with Runlog's settings: run `runlog init` for details")
    servers = {name: serve(base / name) for name in ("reference", "crashed")}
    urls = {name: f"http://127.0.0.1:{s.server_address[1]}" for name, s in servers.items()}
    try:
        _say(quiet, f"demo: worlds in {base} (reference {urls['reference']}, crashed {urls['crashed']})")
        # both workers at once: they share nothing but the broker and Redis
        ref_proc = spawn_worker(settings, urls["reference"], None, params=params, sdk=sdk)
        crash_proc = spawn_worker(settings, urls["crashed"], crash_at, params=params, sdk=sdk)
        try:
            ref_id, rc = wait_worker(ref_proc, base / "worker-reference.log")
            crash_id, crash_rc = wait_worker(crash_proc, base / "worker-crashed.log")
        finally:
            for proc in (ref_proc, crash_proc):
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()
        if rc != 0:
            raise DemoFailed(f"the reference run {ref_id} did not complete (exit {rc})")
        _say(quiet, f"demo: reference run {ref_id} completed")
        if crash_rc != -9:
            raise DemoFailed(f"the crash point {crash_at!r} was never reached (worker exit {crash_rc})")
        _say(quiet, f"demo: run {crash_id} killed with SIGKILL at {crash_at}")
        waited = _wait_lease_gone(settings, crash_id, settings.lease_ttl_ms / 1000 * 3)
        _say(quiet, f"demo: its lease expired after {waited:.1f}s; requesting resume")
        world = WorldClient(urls["crashed"])
        app = app_for(world)
        t0 = time.monotonic()
        request_resume(settings, crash_id, "demo: worker crashed", requested_by="demo")
        done: list[ResumeOutcome] = []
        with ResumerService(settings.with_(resumer_group=f"runlog-demo-resumer-{tag}", sweep_interval_ms=0),
                            app, accept=lambda rid: rid == crash_id,
                            on_outcome=done.append) as service:
            deadline = time.monotonic() + 120
            while not done and time.monotonic() < deadline:
                service.poll_once(0.5)
            demo_group = service.group
        _drop_group(settings, demo_group)  # the demo's one-off group: nothing left behind on the broker
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
        "sdk": sdk,
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
