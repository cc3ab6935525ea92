"""Infrastructure faults: a zombie writer, Redis restarted empty, the projector killed, the broker restarted.

Each test names the protection it proves and fails when that protection is
removed. Redis and broker restarts use private services on other ports
(``deploy/local/up`` with its own ``RUNLOG_LOCAL_DIR``), never the shared ones.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from runlog.processors.admin import ensure_topics
from runlog.processors.demo.client import WorldClient
from runlog.processors.demo.pipeline import app_for, source
from runlog.processors.demo.run import DEFAULT_CRASH_AT, spawn_worker, wait_worker, worker_env
from runlog.processors.demo.world import serve
from runlog.processors.inspect import LoggedEvent, run_history
from runlog.processors.resume import Resumer, ResumerService
from runlog.producers import App, DictInputSource, Runner
from runlog.projections import OutcomeKind, RedisStore, RunStatus, dump_namespace, rebuild, swap_namespaces
from runlog.schemas import DeliveryError, EventType, Settings
from tests.faults._support import ROOT, AckLog, busy_workflow, link_jar_cache, local
from tests.faults.machinery.matrix import projection_mismatches, start_projector
from tests.faults.machinery.report import PointEntry, write_section

pytestmark = [pytest.mark.integration, pytest.mark.slow]

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
    entry.conclude("fenced", t0)
    entry.detail.update({"zombie_epoch": zombie_epoch, "takeover_epoch": outcome.epoch,
                         "events_at_pause": len(paused), "zombie_events_after_takeover": len(zombie_late),
                         "zombie_exit": proc.returncode, "stats_before_sigcont": stats_before,
                         "stats": stats})
    ENTRIES.append(entry)
    assert not entry.failures, (entry.failures, entry.detail, err[-2000:])


# -- 2. Redis restarted empty ------------------------------------------------------------------


REDIS_PORT = "26379"


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A private redis-server on port 26379 (state under tmp_path), stopped and purged at the end."""
    ldir = tmp_path / "local-redis"
    out = local("up", ldir, "--redis-only", RUNLOG_LOCAL_REDIS_PORT=REDIS_PORT)
    url = out.strip().rsplit("=", 1)[1]
    try:
        yield url, ldir
    finally:
        local("down", ldir, "--redis-only", "--kill", "--purge", RUNLOG_LOCAL_REDIS_PORT=REDIS_PORT)


def test_redis_restarted_empty_between_a_crash_and_the_resume(
    topics: Settings, tmp_path: Path, own_redis: tuple[str, Path]
) -> None:
    """Protections: the resume reads the run from the log when Redis holds nothing, and takes a lease
    epoch above the highest one on the log (``epoch``) although the epoch counter was lost."""
    url, ldir = own_redis
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
        local("down", ldir, "--redis-only", "--kill", "--purge", RUNLOG_LOCAL_REDIS_PORT=REDIS_PORT)
        local("up", ldir, "--redis-only", RUNLOG_LOCAL_REDIS_PORT=REDIS_PORT)
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
    entry.conclude("completed", t0)
    entry.detail.update({"resume": outcome.result, "resume_epoch": outcome.epoch,
                         "keys_before_restart": keys_before, "events_at_crash": len(crashed),
                         "events": len(history), "stats": stats, "reason": outcome.detail})
    ENTRIES.append(entry)
    assert not entry.failures, (entry.failures, entry.detail)


def test_redis_restarted_empty_under_a_running_projector_is_rebuilt_from_the_log(
    topics: Settings, tmp_path: Path, own_redis: tuple[str, Path]
) -> None:
    """Protection: every projector write carries the namespace generation, so once Redis comes back
    empty the Lua apply refuses (instead of folding the middle of a run onto nothing) and the
    projector rebuilds the namespace from the log before it goes on. Run A completed before the
    loss and has no event after it: it is back in Redis only because of the rebuild. Run B was
    writing through the loss: its writer loses its lease (the lease key went with Redis), and the
    resumer finishes it."""
    url, ldir = own_redis
    settings = topics.with_(redis_url=url, lease_ttl_ms=2000)
    client = redis.Redis.from_url(url, **settings.redis_kwargs())
    server = serve(tmp_path / "world")
    world_url = f"http://127.0.0.1:{server.server_address[1]}"
    entry = PointEntry("redis restarted empty while the projector and a run are active", "FAILED")
    t0 = time.monotonic()
    plog = tmp_path / "proj.log"
    projector = start_projector(settings, f"{settings.topic_prefix}infra-projector", plog)
    store = RedisStore(client, settings.redis_prefix)
    worker_b: subprocess.Popen[str] | None = None
    try:
        def slow(delay: str) -> subprocess.Popen[str]:
            return subprocess.Popen([sys.executable, "-m", "tests.faults.slow_worker", "--delay", delay],
                                    env=worker_env(settings, world_url), cwd=ROOT, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)

        worker_a = slow("0")
        run_a = _first_line(worker_a, "run_id=")
        rc_a = worker_a.wait(120)
        worker_a.communicate()
        _wait(lambda: (st := store.load_state(run_a)) is not None and st.status is RunStatus.COMPLETED,
              60, "run A to be projected")
        worker_b = slow("0.4")
        run_b = _first_line(worker_b, "run_id=")
        entry.run_id = run_b
        _wait(lambda: (st := store.load_state(run_b)) is not None and st.last_seq >= 6, 60,
              "run B to be projected in part")
        marker_before = store.marker()
        keys_before = client.dbsize()
        client.close()
        local("down", ldir, "--redis-only", "--kill", "--purge", RUNLOG_LOCAL_REDIS_PORT=REDIS_PORT)
        local("up", ldir, "--redis-only", RUNLOG_LOCAL_REDIS_PORT=REDIS_PORT)
        client = redis.Redis.from_url(url, **settings.redis_kwargs())
        store = RedisStore(client, settings.redis_prefix)
        rc_b = worker_b.wait(180)
        out_b = worker_b.communicate()[0]
        outcome = None
        if rc_b != 0:  # fenced by the lost lease: the resumer takes it from the log
            with Resumer(settings, app_for(WorldClient(world_url))) as resumer:
                outcome = resumer.resume(run_b)
        per_run, _glob = projection_mismatches(settings, client, [run_a, run_b], timeout_s=120)
        states = store.load_states([run_a, run_b])
        marker_after = store.marker()
    finally:
        projector.send_signal(signal.SIGTERM)
        projector.wait(30)
        if worker_b is not None and worker_b.poll() is None:
            worker_b.kill()
            worker_b.communicate()
        server.shutdown()
        server.server_close()
        client.close()
    final_b = run_history(settings, run_b)[-1].state
    checks = entry.checks
    checks["run_a_completed_before_the_loss"] = rc_a == 0
    checks["redis_was_emptied"] = keys_before > 0 and marker_before is not None
    checks["run_b_completed"] = final_b.status is RunStatus.COMPLETED and (
        rc_b == 0 or (outcome is not None and outcome.result == "completed"))
    checks["projector_rebuilt_the_namespace"] = (
        marker_after is not None and marker_before is not None and marker_after.gen != marker_before.gen
        and marker_after.state == "ready" and "rebuilding it from the log" in plog.read_text())
    checks["run_a_back_in_redis"] = run_a in states and states[run_a].status is RunStatus.COMPLETED
    checks["run_b_projected_to_the_end"] = run_b in states and states[run_b].last_seq == final_b.last_seq
    checks["projection_equals_rebuild"] = not any(per_run.values())
    entry.completed = checks["run_b_completed"]
    entry.projection_mismatches = sum(len(v) for v in per_run.values())
    entry.conclude("rebuilt", t0)
    entry.detail.update({"run_a": run_a, "worker_b_exit": rc_b, "worker_b_out": out_b.strip()[-300:],
                         "resume": outcome.result if outcome else None, "keys_before": keys_before,
                         "mismatches": {r: v for r, v in per_run.items() if v}})
    ENTRIES.append(entry)
    assert not entry.failures, (entry.failures, entry.detail)


# -- 3. projector killed and restarted ---------------------------------------------------------


def test_projector_killed_and_restarted_while_runs_are_active_converges_to_a_rebuild(
    topics: Settings, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """Protection: the projector is at-least-once with an idempotent apply (the fold drops redelivered
    events, Redis writes are offset-guarded), so replaying from the last commit changes nothing."""
    settings = topics
    app_id = f"{settings.topic_prefix}infra-projector"
    entry = PointEntry("projector SIGKILLed and restarted with 3 runs active", "FAILED")
    t0 = time.monotonic()
    servers = [serve(tmp_path / f"world-{i}") for i in range(3)]
    urls = [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]
    projector = start_projector(settings, app_id, tmp_path / "proj.log")
    workers: list[subprocess.Popen[str]] = []
    store = RedisStore(redis_client, settings.redis_prefix)
    try:
        # each worker waits at its second world request until the gate opens, after the kill: the
        # three runs are active at the kill by construction, not by timing (issue 38, item 5)
        gate = tmp_path / "gate"
        workers = [subprocess.Popen([sys.executable, "-m", "tests.faults.slow_worker", "--delay", "0.3",
                                     "--gate", str(gate), "--gate-at", "1"],
                                    env=worker_env(settings, u), cwd=ROOT, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True) for u in urls]
        run_ids = [_first_line(w, "run_id=") for w in workers]
        entry.run_id = run_ids[0]
        # kill it once it has projected part of every run
        _wait(lambda: len(store.load_states(run_ids)) == len(run_ids), 60, "the projector to start")
        projector.send_signal(signal.SIGKILL)
        projector.wait(10)
        active_at_kill = sum(1 for w in workers if w.poll() is None)
        projected_at_kill = {r: st.last_seq for r, st in store.load_states(run_ids).items()}
        gate.touch()  # the runs go on without a projector
        time.sleep(1.0)
        projector = start_projector(settings, app_id, tmp_path / "proj.log")
        codes = [w.wait(120) for w in workers]
        # a SIGKILLed group member is only replaced after its session times out (about a minute)
        per_run, glob = projection_mismatches(settings, redis_client, run_ids, timeout_s=150)
        states = store.load_states(run_ids)
    finally:
        projector.send_signal(signal.SIGTERM)
        projector.wait(30)
        for w in workers:
            if w.poll() is None:
                w.kill()
            w.communicate()
        for s in servers:
            s.shutdown()
            s.server_close()
    checks = entry.checks
    checks["killed_while_runs_active"] = active_at_kill == len(run_ids)
    checks["runs_completed"] = codes == [0] * len(run_ids) and all(
        states[r].status is RunStatus.COMPLETED for r in run_ids if r in states)
    # per-run keys only: the global delivery-key index is shared by the three runs (same seed, same
    # delivery keys), so which run it names depends on the order of partitions, not on the fault
    checks["projection_equals_rebuild"] = not any(per_run.values())
    entry.completed = checks["runs_completed"]
    entry.projection_mismatches = sum(len(v) for v in per_run.values())
    entry.conclude("converged", t0)
    entry.detail.update({"run_ids": run_ids, "projected_seq_at_kill": projected_at_kill,
                         "worker_exits": codes, "mismatches": {r: v for r, v in per_run.items() if v},
                         "global_mismatches": glob})
    ENTRIES.append(entry)
    assert not entry.failures, (entry.failures, entry.detail)


# -- 4. broker restarted -----------------------------------------------------------------------


KAFKA_PORT = "29292"


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A private single broker on port 29292 (controller 29293), data under tmp_path, purged at the end.
    The jar cache of the repo's ``.runlog`` is linked in, so nothing is fetched."""
    ldir = tmp_path / "local-kafka"
    link_jar_cache(ldir)
    out = local("up", ldir, "--kafka-only", RUNLOG_LOCAL_KAFKA_PORT=KAFKA_PORT)
    bootstrap = out.strip().rsplit("=", 1)[1]
    try:
        yield bootstrap, ldir
    finally:
        local("down", ldir, "--kafka-only", "--kill", "--purge", RUNLOG_LOCAL_KAFKA_PORT=KAFKA_PORT)


@pytest.mark.parametrize("how", ["controlled", "sigkill"])
def test_broker_restarted_mid_run_loses_no_acknowledged_event_and_the_run_completes(
    topics: Settings, tmp_path: Path, own_broker: tuple[str, Path], how: str
) -> None:
    """Protection: the idempotent acks=all producer retries through the outage (``message.timeout.ms``
    covers it) and the session waits for every acknowledgement before it completes the run. The
    broker is stopped either cleanly (SIGTERM) or killed (SIGKILL, log recovery on restart)."""
    bootstrap, ldir = own_broker
    settings = topics.with_(kafka_bootstrap_servers=bootstrap)
    ensure_topics(settings)
    entry = PointEntry(f"broker restarted ({how}) in the middle of a run", "FAILED")
    t0 = time.monotonic()
    writer = AckLog(settings)
    window: dict[str, float] = {}

    def restart() -> None:
        time.sleep(1.5)
        window["down"] = time.monotonic()
        kill = ["--kill"] if how == "sigkill" else []
        local("kafka-restart", ldir, *kill, "--down-for", "2", RUNLOG_LOCAL_KAFKA_PORT=KAFKA_PORT)
        window["up"] = time.monotonic()

    failure: BaseException | None = None
    completed = False
    restarter = threading.Thread(target=restart, name="broker-restart")
    try:
        with Runner.from_settings(settings, source=source(), writer=writer) as runner:
            handle = runner.start_run(busy_workflow(calls=40, pause_s=0.04), {})
            assert handle.session is not None
            run_id = handle.run_id
            entry.run_id = run_id
            restarter.start()
            try:
                completed = runner.execute(handle.session).completed
            except DeliveryError as err:  # the writer gave up: it reports, never drops silently
                failure = err
            last_seq = handle.session.last_seq
    finally:
        if restarter.is_alive():
            restarter.join(120)
        writer.close()
    restarter.join(120)
    history = run_history(settings, run_id)
    on_topic = [le.event.seq for le in history]
    acked = writer.acked_seqs(run_id)
    during = [s for (_, s), at in writer.produced.items()
              if window.get("down", 0) <= at <= window.get("up", 0)]
    checks = entry.checks
    checks["restarted_during_run"] = "up" in window and bool(during)
    checks["no_delivery_error"] = failure is None and not writer.errors
    checks["every_ack_on_topic"] = set(acked) <= set(on_topic)
    checks["nothing_dropped"] = acked == list(range(1, last_seq + 1))
    checks["no_duplicates_on_topic"] = on_topic == sorted(set(on_topic))
    # events produced while the broker was going down or down were held and delivered once it was back
    late = [s for s in during if writer.acked.get((run_id, s), 0) >= window.get("up", 0) - 0.5]
    checks["retried_through_outage"] = bool(late)
    checks["completed"] = completed and history[-1].state.status is RunStatus.COMPLETED
    entry.completed = checks["completed"]
    entry.lost_events = len(set(acked) - set(on_topic))
    entry.conclude("completed", t0)
    entry.detail.update({"events": len(history), "acked": len(acked), "produced_while_down": len(during),
                         "acked_after_restart": len(late),
                         "outage_s": round(window.get("up", 0) - window.get("down", 0), 3),
                         "delivery_errors": writer.errors[:5], "failure": str(failure) if failure else None})
    ENTRIES.append(entry)
    assert not entry.failures, (entry.failures, entry.detail)


def test_a_resumer_outlives_a_broker_outage_longer_than_its_read_deadline(
    topics: Settings, own_broker: tuple[str, Path]
) -> None:
    """Protection: a resume that cannot read the log (``LogUnavailable``: the brokers unreachable past
    the reader's 10 s deadline) is handled like a Redis failure: retried later, the resumer goes on.
    Without it a member paused past its session (``tests/faults/test_membership_resumer.py``,
    fault ``sigstop``) died on its next resume with "reading watermarks ... _ALL_BROKERS_DOWN"."""
    bootstrap, ldir = own_broker
    s = topics.with_(kafka_bootstrap_servers=bootstrap, lease_ttl_ms=1000, sweep_interval_ms=0,
                     resumer_group=f"t-resumer-{uuid.uuid4().hex[:8]}")
    ensure_topics(s)
    wf = busy_workflow(calls=2, pause_s=0.0)
    app = App.of([wf], [], DictInputSource({}))
    with Runner.from_settings(s, source=app.source) as runner:  # started, never executed: a dead worker
        run_id = runner.start_run(wf, {}).run_id
    time.sleep(s.lease_ttl_ms / 1000 * 2)
    entry = PointEntry("broker down past the resumer's read deadline", "FAILED", run_id=run_id)
    t0 = time.monotonic()
    with ResumerService(s, app) as service:
        outage = threading.Thread(target=local, name="broker-outage",
                                  args=("kafka-restart", ldir, "--down-for", "14"),
                                  kwargs={"RUNLOG_LOCAL_KAFKA_PORT": KAFKA_PORT})
        outage.start()
        try:  # the broker is back before the fixture stops it, whatever happens here
            _wait(lambda: not _port_open(int(KAFKA_PORT)), 60, "the broker to stop")
            tried = time.monotonic()
            first = service._resume(run_id, None)  # what poll_once, a retry or the sweep's request runs
            entry.detail["first_attempt_s"] = round(time.monotonic() - tried, 2)
            entry.checks["failed_while_down"] = first is None and time.monotonic() - tried >= 5
            entry.checks["retry_scheduled"] = service.next_retry_in() is not None
        finally:
            outage.join(180)
        done = service.serve(stop=lambda: _status(s, run_id) is RunStatus.COMPLETED, idle_exit_s=60)
        entry.checks["resumed_after_outage"] = done >= 1 and _status(s, run_id) is RunStatus.COMPLETED
    entry.completed = entry.checks["resumed_after_outage"]
    entry.conclude("completed", t0)
    ENTRIES.append(entry)
    assert not entry.failures, (entry.failures, entry.detail)


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _status(settings: Settings, run_id: str) -> RunStatus | None:
    history = run_history(settings, run_id)
    return history[-1].state.status if history else None
