"""Infrastructure faults: a zombie writer, Redis restarted empty, the projector killed, the broker restarted.

Each test names the protection it proves and fails when that protection is
removed. Redis and broker restarts use private services on other ports
(``deploy/local/up`` with its own ``RUNLOG_LOCAL_DIR``), never the shared ones.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from processors.demo.client import WorldClient
from processors.demo.pipeline import app_for
from processors.demo.run import DEFAULT_CRASH_AT, spawn_worker, wait_worker, worker_env
from processors.demo.world import serve
from processors.faults.matrix import start_projector
from processors.faults.report import PointEntry, write_section
from processors.inspect import LoggedEvent, run_history
from processors.resume import Resumer
from projections import OutcomeKind, RedisStore, RunStatus, dump_namespace, rebuild, swap_namespaces
from schemas import EventType, Settings

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ENTRIES: list[PointEntry] = []


@pytest.fixture(scope="module", autouse=True)
def _report(fault_report: Path) -> Iterator[None]:
    yield
    if ENTRIES:
        write_section(fault_report, "infrastructure", ENTRIES)


def _wait(pred: object, timeout_s: float, what: str, every: float = 0.1) -> None:
    assert callable(pred)
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(every)


def _first_line(proc: subprocess.Popen[str], prefix: str, timeout_s: float = 30) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(prefix):
            return line.strip().split("=", 1)[1]
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"the worker printed no {prefix!r} line (exit {proc.poll()})")


def _accepted(history: list[LoggedEvent]) -> list[LoggedEvent]:
    return [le for le in history if le.outcome.kind is OutcomeKind.ACCEPTED]


# -- 1. zombie writer --------------------------------------------------------------------------


def test_a_zombie_writer_is_fenced_by_the_fold_and_refused_by_its_lease(
    topics: Settings, tmp_path: Path
) -> None:
    """Protections: the lease check before every append and effect (``LeaseLost``) and the fold's
    epoch fence (``stale_epoch``)."""
    settings = topics.with_(lease_ttl_ms=1000)
    server = serve(tmp_path / "world")
    url = f"http://127.0.0.1:{server.server_address[1]}"
    world = WorldClient(url)
    entry = PointEntry("zombie writer: SIGSTOP past the lease, takeover, SIGCONT", "FAILED")
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "tests.faults.slow_worker", "--delay", "0.4"],
                            env=worker_env(settings, url), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        run_id = _first_line(proc, "run_id=")
        entry.run_id = run_id
        _wait(lambda: any(le.event.type is EventType.VERIFIED for le in run_history(settings, run_id)),
              30, "the zombie's first VERIFIED", every=0.05)
        proc.send_signal(signal.SIGSTOP)
        paused = run_history(settings, run_id)
        zombie_epoch = paused[-1].event.epoch
        time.sleep(settings.lease_ttl_ms / 1000 * 2)  # well past its lease
        with Resumer(settings, app_for(world)) as resumer:
            outcome = resumer.resume(run_id)
        assert outcome.result == "completed", outcome
        after_takeover = run_history(settings, run_id)
        stats_before = world.stats()
        proc.send_signal(signal.SIGCONT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.communicate()
        stats = world.stats()
        server.shutdown()
        server.server_close()
    history = run_history(settings, run_id)
    takeover = next(i for i, le in enumerate(history) if le.event.type is EventType.LEASE_ACQUIRED
                    and le.event.epoch > zombie_epoch)
    zombie_late = [le for le in history[takeover:] if le.event.epoch == zombie_epoch]
    state = history[-1].state if _accepted(history) else None
    checks = entry.checks
    checks["takeover_completed"] = outcome.result == "completed" and outcome.epoch > zombie_epoch
    # every append of the zombie after the takeover was refused (LeaseLost) or fenced by the fold
    checks["zombie_appends_fenced"] = all(
        le.outcome.kind is OutcomeKind.REJECTED_FENCED and le.outcome.reason == "stale_epoch"
        for le in zombie_late)
    checks["zombie_stopped_by_lease"] = proc.returncode == 3 and "lease_lost=" in out
    # its side effects were refused: the world saw nothing from it after SIGCONT
    checks["no_zombie_side_effects"] = stats == stats_before
    checks["one_article"] = stats["publishes"] == 1
    checks["renders_billed_once"] = stats["renders_billed"] == 3
    checks["assets_stored_once"] = stats["assets"] == 3
    final = _accepted(history)[-1].state
    checks["completed"] = final.status is RunStatus.COMPLETED and state is not None
    checks["state_unchanged_by_zombie"] = (final.last_seq == _accepted(after_takeover)[-1].state.last_seq
                                           and final.epoch == outcome.epoch)
    entry.completed = checks["completed"]
    entry.duplicate_effects = max(0, stats["publishes"] - 1) + max(0, stats["assets"] - 3)
    entry.duplicate_renders = max(0, stats["renders_billed"] - 3)
    entry.failures = sorted(k for k, v in checks.items() if not v)
    entry.outcome = "fenced" if not entry.failures else "FAILED"
    entry.seconds = round(time.monotonic() - t0, 3)
    entry.detail.update({"zombie_epoch": zombie_epoch, "takeover_epoch": outcome.epoch,
                         "events_at_pause": len(paused), "zombie_events_after_takeover": len(zombie_late),
                         "zombie_exit": proc.returncode, "stats_before_sigcont": stats_before,
                         "stats": stats})
    ENTRIES.append(entry)
    assert not entry.failures, (entry.failures, entry.detail, err[-2000:])


# -- 2. Redis restarted empty ------------------------------------------------------------------


def _local(cmd: str, local_dir: Path, *args: str, **ports: str) -> str:
    """Run a ``deploy/local`` script against private services (never the shared ones)."""
    env = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP_SERVERS", "REDIS_URL")}
    env.update({"RUNLOG_LOCAL_DIR": str(local_dir), **ports})
    proc = subprocess.run([str(ROOT / "deploy" / "local" / cmd), *args], env=env, capture_output=True,
                          text=True, timeout=180, check=False)
    assert proc.returncode == 0, f"deploy/local/{cmd} {' '.join(args)} failed: {proc.stderr[-2000:]}"
    return proc.stdout


REDIS_PORT = "36379"


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A private redis-server on port 36379 (state under tmp_path), stopped and purged at the end."""
    local = tmp_path / "local-redis"
    out = _local("up", local, "--redis-only", RUNLOG_LOCAL_REDIS_PORT=REDIS_PORT)
    url = out.strip().rsplit("=", 1)[1]
    try:
        yield url, local
    finally:
        _local("down", local, "--redis-only", "--kill", "--purge", RUNLOG_LOCAL_REDIS_PORT=REDIS_PORT)


def test_redis_restarted_empty_between_a_crash_and_the_resume(
    topics: Settings, tmp_path: Path, own_redis: tuple[str, Path]
) -> None:
    """Protections: the resume reads the run from the log when Redis holds nothing, and takes a lease
    epoch above the highest one on the log (``min_epoch``) although the epoch counter was lost."""
    url, local = own_redis
    settings = topics.with_(redis_url=url, lease_ttl_ms=1000)
    client = redis.Redis.from_url(url, **settings.redis_kwargs())
    server = serve(tmp_path / "world")
    world_url = f"http://127.0.0.1:{server.server_address[1]}"
    world = WorldClient(world_url)
    entry = PointEntry(f"redis restarted empty after a crash at {DEFAULT_CRASH_AT}", "FAILED")
    t0 = time.monotonic()
    projector = start_projector(settings, f"{settings.topic_prefix}infra-projector", tmp_path / "proj.log")
    try:
        run_id, rc = wait_worker(spawn_worker(settings, world_url, DEFAULT_CRASH_AT), tmp_path / "w.log",
                                 timeout_s=120)
        entry.run_id = run_id
        assert rc == -9, f"the worker was not killed at its crash point (exit {rc})"
        crashed = run_history(settings, run_id)
        store = RedisStore(client, settings.redis_prefix)
        _wait(lambda: (st := store.load_state(run_id)) is not None and st.offset >= crashed[-1].offset,
              60, "the projector to reach the crash")
    finally:
        projector.send_signal(signal.SIGTERM)
        projector.wait(30)
    try:
        keys_before = client.dbsize()
        client.close()
        # restart Redis empty: kill it, delete its data, start it again
        _local("down", local, "--redis-only", "--kill", "--purge", RUNLOG_LOCAL_REDIS_PORT=REDIS_PORT)
        _local("up", local, "--redis-only", RUNLOG_LOCAL_REDIS_PORT=REDIS_PORT)
        client = redis.Redis.from_url(url, **settings.redis_kwargs())
        keys_after_restart = client.dbsize()
        with Resumer(settings, app_for(world)) as resumer:
            outcome = resumer.resume(run_id)
        stats = world.stats()
    finally:
        server.shutdown()
        server.server_close()
    history = run_history(settings, run_id)
    final = history[-1].state
    # the projections, rebuilt from the log, become the live namespace again
    target = f"{settings.redis_prefix}.rebuilt"
    rebuild(settings, target, progress=None, client=client)
    swap_namespaces(client, settings.redis_prefix, target)
    live = dump_namespace(client, settings.redis_prefix)
    projected = RedisStore(client, settings.redis_prefix).load_state(run_id)
    client.close()
    checks = entry.checks
    checks["redis_was_emptied"] = keys_before > 0 and keys_after_restart == 0
    checks["resume_completed"] = outcome.result == "completed"
    checks["new_epoch_above_log"] = outcome.epoch > max(le.event.epoch for le in crashed)
    checks["completed"] = final.status is RunStatus.COMPLETED
    accepted = _accepted(history)
    checks["nothing_rejected"] = len(accepted) == len(history)
    checks["one_article"] = stats["publishes"] == 1
    checks["renders_billed_once"] = stats["renders_billed"] == 3
    checks["assets_stored_once"] = stats["assets"] == 3
    checks["projection_rebuilt"] = (projected is not None and projected.status is RunStatus.COMPLETED
                                    and projected.last_seq == final.last_seq
                                    and f"{{{run_id}}}:checkpoints" in live)
    entry.completed = checks["completed"]
    entry.duplicate_effects = max(0, stats["publishes"] - 1) + max(0, stats["assets"] - 3)
    entry.duplicate_renders = max(0, stats["renders_billed"] - 3)
    entry.failures = sorted(k for k, v in checks.items() if not v)
    entry.outcome = "completed" if not entry.failures else "FAILED"
    entry.seconds = round(time.monotonic() - t0, 3)
    entry.detail.update({"resume": outcome.result, "resume_epoch": outcome.epoch,
                         "keys_before_restart": keys_before, "events_at_crash": len(crashed),
                         "events": len(history), "stats": stats, "reason": outcome.detail})
    ENTRIES.append(entry)
    assert not entry.failures, (entry.failures, entry.detail)
