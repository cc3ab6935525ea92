"""The network fault matrix: Toxiproxy between every Runlog process and Kafka and Redis.

Three Runlog processes take part in each cell: a demo worker (:mod:`tests.faults.net_worker`, a
subprocess that stops at a boundary of its run until the fault is in place), the projector
(``runlog project``, a subprocess for the whole matrix) and a :class:`ResumerService` (the resumer
group, in this process). Each has its own proxy in front of Redis (the shared one) and in front of
its own listener of a private single-node broker (:mod:`tests.faults._network`): the broker
advertises each listener as its proxy's address, so a Kafka client that reconnects to what the
broker advertised still goes through its proxy. The harness reads the log and Redis directly.

Faults: latency with jitter and a bandwidth limit on every connection for a whole run; connections
reset in the middle of Redis writes (``limit_data``: a connection is closed after a few hundred bytes,
inside a command or pipeline); a half-open Redis connection (``timeout``: nothing comes back, nothing
is closed) for longer than the lease, and a Kafka connection that carries nothing for 5 s and is then
closed; and each process partitioned from Redis only or from Kafka only
for longer than its lease (3 s) and session timeout (projector 6 s, resumer 10 s), at the effect
boundaries: the worker between the publish's acknowledged intent and its call, the resumer between
taking the run over and reconciling the publish. After each: the run completed, the world holds one
article, 3 renders billed and 3 assets (no effect twice), the accepted log is gapless and ends
``RUN_COMPLETED`` (nothing lost), the live projection equals a rebuild of the log, and every process
is alive or, if the fault cut it off, stopped on its own with a clear exit (no hang).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from runlog.processors.admin import ensure_topics
from runlog.processors.chaos.services import stop_process
from runlog.processors.demo.client import WorldClient
from runlog.processors.demo.pipeline import build, source
from runlog.processors.demo.world import serve
from runlog.processors.inspect import run_history
from runlog.processors.resume import App, ResumeOutcome, ResumerService, request_resume
from runlog.producers import crash
from runlog.producers.log._lease import lease_key
from runlog.projections import OutcomeKind, RunStatus
from runlog.schemas import EventType, Settings
from tests.conftest import require
from tests.faults._network import (
    PORTS,
    ProxiedBroker,
    Toxiproxy,
    free_ports,
    proxied_broker_running,
    toxiproxy_binary,
    toxiproxy_running,
)
from tests.faults.machinery import CONTENT_EXPECT, RoutingWorld, projection_mismatches, worker_env
from tests.faults.machinery.report import PointEntry, write_section

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ROLES = ("worker", "projector", "resumer")
LEASE_TTL_MS = 3000
PROJECTOR_SESSION_MS = 6000  # the broker's group.min.session.timeout.ms
RESUMER_SESSION_MS = 10_000  # ResumerService's own
PUBLISH = "publish/publish/0"
"""The call id of the content workflow's RECONCILE_FIRST publish: the effect boundary of the matrix."""


@dataclass
class Net:
    """The matrix's services: the proxies, the broker, the settings of each role and of the harness."""

    proxy: Toxiproxy
    broker: ProxiedBroker
    harness: Settings
    roles: dict[str, Settings]
    redis: redis.Redis
    workdir: Path

    def all_proxies(self) -> list[str]:
        return [f"{svc}-{r}" for svc in ("kafka", "redis") for r in ROLES]


@pytest.fixture
def net(settings: Settings, tmp_path: Path) -> Iterator[Net]:
    binary, why = toxiproxy_binary()
    require(binary is not None, f"no toxiproxy-server: deploy/local/toxiproxy build failed: {why}")
    assert binary is not None
    with toxiproxy_running(tmp_path / "toxiproxy", binary) as proxy, \
            proxied_broker_running(tmp_path / "broker", proxy, ROLES) as broker:
        host_port = settings.redis_url.split("://", 1)[1].split("/", 1)[0]
        db = settings.redis_url.rsplit("/", 1)[1]
        redis_ports = dict(zip(ROLES, free_ports(len(ROLES), *PORTS), strict=True))
        for r in ROLES:
            proxy.create(f"redis-{r}", redis_ports[r], host_port)
        harness = settings.with_(kafka_bootstrap_servers=broker.internal, lease_ttl_ms=LEASE_TTL_MS)
        ensure_topics(harness)
        roles = {r: harness.with_(kafka_bootstrap_servers=broker.clients[r],
                                  redis_url=f"redis://127.0.0.1:{redis_ports[r]}/{db}") for r in ROLES}
        client = redis.Redis.from_url(settings.redis_url, **settings.redis_kwargs())
        try:
            yield Net(proxy, broker, harness, roles, client, tmp_path)
        finally:
            client.close()


# -- one cell ---------------------------------------------------------------------------------------


@dataclass
class Cell:
    """One fault of the matrix: what it cuts, where, for how long."""

    name: str
    inject: Callable[[Toxiproxy], None]
    heal: Callable[[Toxiproxy], None]
    hold_s: float = 0.0
    """How long the fault stays after it lands (0: for the worker's whole run)."""
    worker_at: str | None = None
    """The worker's pause point: the fault lands there. None: before the worker starts."""
    resumer_at: str | None = None
    """The worker SIGKILLs itself at ``crash_at`` and the fault lands at this point of the resumer's
    takeover (in this process), healed ``hold_s`` later while the resume goes on."""
    crash_at: str | None = None
    cut_off: frozenset[str] = frozenset()
    """The roles the fault cuts off: they may stop (a clear exit), never hang."""
    projector_batch: bool = False
    """The fault must hit the projector while it writes a batch (its log says it retried one)."""
    detail: dict[str, Any] = field(default_factory=dict)


def _partition(proxies: list[str]) -> tuple[Callable[[Toxiproxy], None], Callable[[Toxiproxy], None]]:
    def cut(p: Toxiproxy) -> None:
        for name in proxies:
            p.enable(name, False)

    def heal(p: Toxiproxy) -> None:
        for name in proxies:
            p.enable(name, True)
    return cut, heal


def _toxic(proxies: list[str], kind: str, streams: tuple[str, ...] = ("downstream",), **attrs: int
           ) -> tuple[Callable[[Toxiproxy], None], Callable[[Toxiproxy], None]]:
    def add(p: Toxiproxy) -> None:
        for name in proxies:
            for s in streams:
                p.add(name, f"{kind}-{s}", kind, stream=s, **attrs)

    def remove(p: Toxiproxy) -> None:
        for name in proxies:
            for s in streams:
                p.remove(name, f"{kind}-{s}")
    return add, remove


class Matrix:
    """Runs the cells one after the other against one projector and one resumer service."""

    def __init__(self, net: Net) -> None:
        self.net = net
        self.router = RoutingWorld()
        wf, tools = build(self.router)
        self.app = App.of([wf], tools, source())
        self.outcomes: list[ResumeOutcome] = []
        rs = net.roles["resumer"].with_(resumer_group=f"{net.harness.topic_prefix}net-resumer",
                                        sweep_interval_ms=0)
        self.service = ResumerService(rs, self.app, accept=self.router.select,
                                      on_outcome=self.outcomes.append)
        self.plog = net.workdir / "projector.log"
        self.projector = self._start_projector()
        self.run_ids: list[str] = []

    def _start_projector(self) -> subprocess.Popen[bytes]:
        with open(self.plog, "ab") as err:
            return subprocess.Popen(
                [sys.executable, "-m", "runlog", "project", "--app-id",
                 f"{self.net.harness.topic_prefix}net-projector", "--within", "0.2",
                 "--session-timeout-ms", str(PROJECTOR_SESSION_MS)],
                cwd=ROOT, env=worker_env(self.net.roles["projector"]), stdout=subprocess.DEVNULL, stderr=err)

    def close(self) -> None:
        try:
            self.service.close()
        finally:
            stop_process(self.projector)

    # -- pieces ------------------------------------------------------------------------------------

    def _worker(self, url: str, signals: Path, cell: Cell) -> subprocess.Popen[str]:
        extra = {"RUNLOG_DEMO_WORLD_URL": url}
        if cell.crash_at:
            extra["RUNLOG_CRASH_AT"] = cell.crash_at
        cmd = [sys.executable, "-m", "tests.faults.net_worker"]
        if cell.worker_at:
            cmd += ["--pause-at", cell.worker_at, "--signals", str(signals)]
        if cell.crash_at:  # the crash points of the demo worker: SIGKILL at the point
            cmd = [sys.executable, "-m", "runlog.processors.demo.worker"]
        return subprocess.Popen(cmd, env=worker_env(self.net.roles["worker"], **extra), cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    @staticmethod
    def _run_id(proc: subprocess.Popen[str], timeout_s: float = 60) -> str:
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line.startswith("run_id="):
                return line.strip().split("=", 1)[1]
            if not line and proc.poll() is not None:
                break
        raise AssertionError(f"the worker printed no run id (exit {proc.poll()})")

    def _wait_lease_gone(self, run_id: str, timeout_s: float = 30) -> bool:
        key = lease_key(self.net.harness.redis_prefix, run_id)
        deadline = time.monotonic() + timeout_s
        while self.net.redis.exists(key):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def _status(self, run_id: str) -> RunStatus | None:
        history = run_history(self.net.harness, run_id)
        return history[-1].state.status if history else None

    def _resume(self, run_id: str, timeout_s: float = 90) -> list[str]:
        """Request a resume and serve the group until the run completed (retries included); the
        outcomes seen."""
        request_resume(self.net.harness, run_id, "network faults: worker stopped", requested_by="faults")
        seen: list[str] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.service.run_due_retries()
            self.service.poll_once(0.2)
            for o in [o for o in self.outcomes if o.run_id == run_id]:
                self.outcomes.remove(o)
                seen.append(o.result)
            if "completed" in seen or self._status(run_id) is RunStatus.COMPLETED:
                break
        return seen

    # -- a cell ------------------------------------------------------------------------------------

    def run(self, cell: Cell) -> PointEntry:
        entry = PointEntry(cell.name, "FAILED")
        t0 = time.monotonic()
        cdir = self.net.workdir / cell.name
        signals = cdir / "signals"
        signals.mkdir(parents=True)
        server = serve(cdir / "world")
        url = f"http://127.0.0.1:{server.server_address[1]}"
        self.router.forget(url)
        world = WorldClient(url)
        proxy = self.net.proxy
        healer: threading.Timer | None = None
        worker: subprocess.Popen[str] | None = None
        plog_at = self.plog.stat().st_size if self.plog.exists() else 0
        injected: dict[str, float] = {}

        def inject_then_heal_later(point: str = "") -> None:
            cell.inject(proxy)
            injected["at"] = time.monotonic()
            entry.detail["fault_at"] = point or "whole run"
            nonlocal healer
            def heal() -> None:
                cell.heal(proxy)
                injected["healed"] = time.monotonic()

            healer = threading.Timer(cell.hold_s, heal)
            healer.start()

        try:
            if cell.worker_at is None and cell.resumer_at is None:
                cell.inject(proxy)  # for the whole run
                injected["at"] = time.monotonic()
                entry.detail["fault_at"] = "whole run"
            worker = self._worker(url, signals, cell)
            run_id = self._run_id(worker)
            entry.run_id = run_id
            self.run_ids.append(run_id)
            self.router.urls[run_id] = url
            if cell.worker_at is not None:
                deadline = time.monotonic() + 90
                while not (signals / "reached").exists():
                    assert worker.poll() is None and time.monotonic() < deadline, (
                        f"the worker did not reach {cell.worker_at} (exit {worker.poll()})")
                    time.sleep(0.02)
                inject_then_heal_later((signals / "reached").read_text())
                (signals / "go").touch()
            try:
                rc: int | None = worker.wait(120)
            except subprocess.TimeoutExpired:
                rc = None  # hung: a finding, not a pass
            if cell.worker_at is None and cell.resumer_at is None:
                cell.heal(proxy)
            if healer is not None:
                healer.join(60)
            out, err = worker.communicate(timeout=10) if rc is not None else ("", "")
            entry.detail["worker_exit"] = rc
            entry.detail["worker_out"] = out.strip()[-200:]
            if rc not in (0, None):
                entry.detail["worker_err"] = err.strip()[-600:]
            resumes: list[str] = []
            if rc != 0 and rc is not None:
                lease_gone = self._wait_lease_gone(run_id)
                entry.checks["worker_lease_expired"] = lease_gone
                if cell.resumer_at is not None:
                    crash.on_reach(inject_then_heal_later)
                    crash.arm(cell.resumer_at)
                try:
                    resumes = self._resume(run_id)
                finally:
                    crash.arm(None)
                    crash.on_reach(None)
                    if healer is not None:
                        healer.join(60)
                entry.detail["resumes"] = resumes
            self._check(entry, cell, world, rc)
            with open(self.plog, "rb") as f:
                f.seek(plog_at)
                retried = f.read().decode(errors="replace").count("Redis unreachable, retrying the batch")
            entry.detail["projector_batch_retries"] = retried
            if cell.projector_batch:
                entry.checks["projector_batch_hit"] = retried > 0
        finally:
            if worker is not None and worker.poll() is None:
                worker.kill()
                worker.communicate()
            if healer is not None:
                healer.cancel()
            proxy.reset()
            server.shutdown()
            server.server_close()
        if "at" in injected:
            entry.detail["fault_s"] = round(injected.get("healed", time.monotonic()) - injected["at"], 2)
        entry.detail.update(cell.detail)
        entry.conclude("completed", t0)
        return entry

    def _check(self, entry: PointEntry, cell: Cell, world: WorldClient, rc: int | None) -> None:
        assert entry.run_id is not None
        e, checks = CONTENT_EXPECT, entry.checks
        history = run_history(self.net.harness, entry.run_id)
        accepted = [le for le in history if le.outcome.kind is OutcomeKind.ACCEPTED]
        state = accepted[-1].state if accepted else None
        stats = world.stats()
        entry.detail["stats"] = stats
        entry.detail["events"] = len(history)
        entry.detail["epochs"] = sorted({le.event.epoch for le in history})
        entry.completed = state is not None and state.status is RunStatus.COMPLETED
        checks["completed"] = entry.completed
        checks["one_article"] = stats["publishes"] == e.publishes
        checks["renders_billed_once"] = stats["renders_billed"] == e.renders_billed
        checks["assets_stored_once"] = stats["assets"] == e.assets
        seqs = [le.event.seq for le in accepted]
        checks["seq_gapless"] = seqs == list(range(1, len(seqs) + 1))
        checks["log_complete"] = bool(accepted) and accepted[-1].event.type is EventType.RUN_COMPLETED
        checks["effects_closed"] = state is not None and not state.open_effects and \
            len(state.closed_effects) == e.effects
        rejected = [le for le in history if le.outcome.kind is not OutcomeKind.ACCEPTED]
        # a writer cut off from Redis past its lease may have appended after the takeover: fenced, seen
        checks["only_stale_epochs_rejected"] = all(
            le.outcome.kind is OutcomeKind.REJECTED_FENCED for le in rejected)
        entry.detail["rejected"] = len(rejected)
        entry.lost_events = len(set(range(1, max(seqs, default=0) + 1)) - set(seqs))
        entry.duplicate_effects = (max(0, stats["publishes"] - e.publishes)
                                   + max(0, stats["assets"] - e.assets))
        entry.duplicate_renders = max(0, stats["renders_billed"] - e.renders_billed)
        # no hang: the worker ended on its own; cut off, it may stop with its lease lost or a failure
        # a cell whose point was never reached proves nothing
        checks["fault_landed"] = "fault_at" in entry.detail
        checks["worker_not_hung"] = rc is not None
        checks["worker_exit_clear"] = rc == 0 or ("worker" in cell.cut_off and rc in (1, 3)) or (
            cell.crash_at is not None and rc == -signal.SIGKILL)
        checks["projector_alive"] = self.projector.poll() is None
        per_run, _glob = projection_mismatches(self.net.harness, self.net.redis, [entry.run_id], timeout_s=60)
        entry.projection_mismatches = sum(len(v) for v in per_run.values())
        checks["projection_equals_rebuild"] = entry.projection_mismatches == 0
        if entry.projection_mismatches:
            entry.detail["mismatches"] = per_run
        checks["projector_still_alive"] = self.projector.poll() is None


def cells() -> list[Cell]:
    every = [f"{svc}-{r}" for svc in ("kafka", "redis") for r in ROLES]
    inside_publish = f"inside:TOOL:{PUBLISH}"
    hold_lease = LEASE_TTL_MS / 1000 * 2 + 1
    out: list[Cell] = []
    add, rm = _toxic(every, "latency", ("downstream", "upstream"), latency=40, jitter=30)
    out.append(Cell("latency 40 ms +- 30 ms jitter, every connection, both ways, whole run", add, rm,
                    detail={"latency_ms": 40, "jitter_ms": 30}))
    add, rm = _toxic(every, "bandwidth", ("downstream", "upstream"), rate=16)
    out.append(Cell("bandwidth 16 KB/s, every connection, both ways, whole run", add, rm,
                    detail={"rate_kb_s": 16}))
    add, rm = _toxic(["redis-worker", "redis-projector"], "limit_data", ("upstream",), bytes=400)
    out.append(Cell("redis connections reset mid-pipeline (400 bytes each), worker and projector, "
                    f"at {inside_publish}", add, rm, hold_s=2.0, worker_at=inside_publish,
                    cut_off=frozenset({"worker"}), detail={"bytes_per_connection": 400}))
    add, rm = _toxic(["redis-worker"], "timeout", ("downstream",), timeout=0)
    out.append(Cell("redis half-open to the worker (requests arrive, no reply) past its lease, "
                    f"at {inside_publish}", add, rm, hold_s=hold_lease, worker_at=inside_publish,
                    cut_off=frozenset({"worker"})))
    # nothing flows either way for 5 s, then Toxiproxy closes the connection: the producer's requests
    # in flight (the publish's result and what follows) are retried on a new connection
    add, rm = _toxic(["kafka-worker"], "timeout", ("upstream", "downstream"), timeout=5000)
    out.append(Cell(f"kafka half-open to the worker for 5 s, then closed, at {inside_publish}", add, rm,
                    hold_s=6.0, worker_at=inside_publish, cut_off=frozenset({"worker"})))
    cut, heal = _partition(["redis-worker"])
    out.append(Cell(f"worker partitioned from redis past its lease, at {inside_publish}", cut, heal,
                    hold_s=hold_lease, worker_at=inside_publish, cut_off=frozenset({"worker"})))
    cut, heal = _partition(["kafka-worker"])
    out.append(Cell(f"worker partitioned from kafka past its lease, at {inside_publish}", cut, heal,
                    hold_s=hold_lease, worker_at=inside_publish, cut_off=frozenset({"worker"})))
    cut, heal = _partition(["redis-projector"])
    out.append(Cell("projector partitioned from redis past the lease, mid-run (at after:VERIFIED:research)",
                    cut, heal, hold_s=hold_lease, worker_at="after:VERIFIED:research", projector_batch=True))
    cut, heal = _partition(["kafka-projector"])
    out.append(Cell("projector partitioned from kafka past its session timeout, mid-run "
                    "(at after:VERIFIED:research)", cut, heal, hold_s=PROJECTOR_SESSION_MS / 1000 + 3,
                    worker_at="after:VERIFIED:research"))
    # the worker dies between the publish and its recorded result; the resumer reconciles it
    died, reconcile = f"before:EFFECT_RESULT:{PUBLISH}", f"before:EFFECT_RECONCILED:{PUBLISH}"
    cut, heal = _partition(["redis-resumer"])
    out.append(Cell(f"resumer partitioned from redis past the lease, taking over at {reconcile}",
                    cut, heal, hold_s=hold_lease, crash_at=died, resumer_at=reconcile,
                    cut_off=frozenset({"worker"})))
    cut, heal = _partition(["kafka-resumer"])
    out.append(Cell(f"resumer partitioned from kafka past its session timeout, taking over at {reconcile}",
                    cut, heal, hold_s=RESUMER_SESSION_MS / 1000 + 2, crash_at=died, resumer_at=reconcile,
                    cut_off=frozenset({"worker"})))
    return out


def test_network_fault_matrix(net: Net, fault_report: Path) -> None:
    """Every cell: no effect twice, nothing lost, rebuild equals live, every process alive or stopped
    clearly when cut off."""
    entries: list[PointEntry] = []
    t0 = time.monotonic()
    matrix = Matrix(net)
    try:
        for cell in cells():
            entries.append(matrix.run(cell))
    finally:
        matrix.close()
        if entries:
            write_section(fault_report, "network", entries, toxiproxy=net.proxy.version(),
                          seconds=round(time.monotonic() - t0, 1))
    bad = {e.point: (e.failures, e.detail) for e in entries if e.failures}
    assert not bad, bad
    assert len(entries) == len(cells())
