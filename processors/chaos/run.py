"""``runlog chaos``: a mixed workload on private services for a chosen duration while a scheduler injects
random faults of every kind; then the faults stop, everything settles, and the count is printed.

Phases: start the private services (:mod:`.services`), the demo world, the fleet (:mod:`.fleet`) and the
workload (:mod:`.workload`); run the fault plan (:mod:`.faults`) for ``duration``; stop faults and new
runs, heal the network, let the runs in flight finish and the projection catch up (``settle``); count
(:mod:`.count`) and report (:mod:`.report`).
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runlog.processors.admin import ensure_topics
from runlog.processors.chaos.count import Count, gather
from runlog.processors.chaos.faults import KINDS, Action, Scheduler, plan
from runlog.processors.chaos.fleet import Fleet
from runlog.processors.chaos.reaper import Reaper
from runlog.processors.chaos.services import ROLES, Services, stop_process
from runlog.processors.chaos.workload import Workload
from runlog.processors.demo.world import serve
from runlog.projections import RedisStore, RunStatus
from runlog.schemas import Settings

__all__ = ["ChaosOptions", "ChaosResult", "run_chaos"]

_ROOT = str(Path(__file__).resolve().parents[2])
_TERMINAL = {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.BLOCKED, RunStatus.CANCELLED}


@dataclass(frozen=True)
class ChaosOptions:
    duration: float = 3600.0
    """Seconds of faults and new runs."""
    workdir: Path = Path("/tmp/runlog-chaos")
    seed: int | None = None
    in_flight: int = 3
    gap: tuple[float, float] = (15.0, 45.0)
    """Seconds between two faults, drawn uniformly."""
    settle: float = 300.0
    """Seconds at most for the runs in flight to end once the faults stopped."""
    kinds: tuple[str, ...] = KINDS
    lease_ttl_ms: int = 5000


@dataclass
class ChaosResult:
    options: ChaosOptions
    seed: int
    seconds: float
    started: int
    signalled: int
    resolved: dict[str, str]
    """Run id -> how its charge in doubt was resolved."""
    faults: dict[str, int]
    faults_failed: dict[str, int]
    count: Count
    members: dict[str, int | None] = field(default_factory=dict)
    worker_ends: dict[str, int] = field(default_factory=dict)
    died: dict[str, int | None] = field(default_factory=dict)
    """Resumer and projector members that exited on their own, with their exit codes (the logs in
    ``workdir/logs``)."""
    fault_log: list[dict[str, Any]] = field(default_factory=list)


def _env(settings: Settings, world_url: str, reaper: Reaper) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNLOG_") and k not in
           ("KAFKA_BOOTSTRAP_SERVERS", "REDIS_URL")}
    env.update(settings.with_(metrics_port=0).to_env())
    env["RUNLOG_DEMO_WORLD_URL"] = world_url
    env.update(reaper.env)  # the run's mark, which the RUNLOG_ filter above left out
    env["PYTHONPATH"] = _ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    return env


class _Actions:
    """The fault kinds, acted out on one chaos run's services, fleet and workload."""

    def __init__(self, services: Services, fleet: Fleet, workload: Workload) -> None:
        self.s, self.fleet, self.wl = services, fleet, workload

    def table(self) -> dict[str, Action]:
        return {"kill-worker": lambda rng: self._signal_worker(rng, stop=False),
                "stop-worker": lambda rng: self._signal_worker(rng, stop=True),
                "kill-resumer": lambda rng: self._signal_member(rng, "resumer", stop=False),
                "stop-resumer": lambda rng: self._signal_member(rng, "resumer", stop=True),
                "kill-projector": lambda rng: self._signal_member(rng, "projector", stop=False),
                "stop-projector": lambda rng: self._signal_member(rng, "projector", stop=True),
                "broker-restart": self._broker, "redis-restart": self._redis, "membership": self._membership,
                "net-latency": self._latency, "net-reset": self._reset, "net-partition": self._partition}

    @staticmethod
    def _pause(rng: random.Random, pid: int) -> float:
        secs = rng.uniform(2.0, 12.0)
        os.killpg(pid, signal.SIGSTOP)
        try:
            time.sleep(secs)
        finally:
            os.killpg(pid, signal.SIGCONT)
        return secs

    def _signal_worker(self, rng: random.Random, *, stop: bool) -> tuple[str, float]:
        alive = self.wl.alive()
        if not alive:
            raise LookupError("no worker alive")
        w = rng.choice(alive)
        what = f"worker-{w.n} ({w.workflow}/{w.sdk}, run {w.read_run_id() or '?'})"
        if stop:
            return what, self._pause(rng, w.proc.pid)
        w.killed = True
        os.killpg(w.proc.pid, signal.SIGKILL)
        return what, 0.0

    def _signal_member(self, rng: random.Random, role: str, *, stop: bool) -> tuple[str, float]:
        alive = self.fleet.alive(role)
        if not alive:
            raise LookupError(f"no {role} alive")
        m = rng.choice(alive)
        if stop:
            return m.name, self._pause(rng, m.proc.pid)
        m.fate = "killed"
        os.killpg(m.proc.pid, signal.SIGKILL)
        m.proc.wait(10)
        down = rng.uniform(1.0, 8.0)
        time.sleep(down)
        self.fleet.replace_dead()
        return m.name, down

    def _broker(self, rng: random.Random) -> tuple[str, float]:
        kill, down = rng.random() < 0.5, rng.uniform(1.0, 8.0)
        t0 = time.monotonic()
        self.s.restart_broker(kill=kill, down_for=down)
        return f"broker ({'SIGKILL' if kill else 'SIGTERM'}, down {down:.1f}s)", time.monotonic() - t0

    def _redis(self, rng: random.Random) -> tuple[str, float]:
        kill, down = rng.random() < 0.7, rng.uniform(0.5, 5.0)
        t0 = time.monotonic()
        self.s.restart_redis(kill=kill, down_for=down)
        return f"redis ({'SIGKILL' if kill else 'SIGTERM'}, down {down:.1f}s)", time.monotonic() - t0

    def _membership(self, rng: random.Random) -> tuple[str, float]:
        role = rng.choice(("resumer", "projector"))
        alive = self.fleet.alive(role)
        if len(alive) > self.fleet.low and (len(alive) >= self.fleet.high or rng.random() < 0.5):
            m = rng.choice(alive)
            m.fate = "left"
            stop_process(m.proc, signal.SIGTERM, wait=60)
            return f"{m.name} left", 0.0
        m = self.fleet.start(role)
        return f"{m.name} joined", 0.0

    def _proxy(self, rng: random.Random) -> str:
        return f"{rng.choice(('kafka', 'redis'))}-{rng.choice(ROLES)}"

    def _latency(self, rng: random.Random) -> tuple[str, float]:
        proxy, secs = self._proxy(rng), rng.uniform(5.0, 20.0)
        ms, jitter = rng.randint(100, 1500), rng.randint(0, 500)
        with self.s.proxy.toxic(proxy, "chaos-latency", "latency", latency=ms, jitter=jitter):
            time.sleep(secs)
        return f"{proxy} +{ms}ms±{jitter}", secs

    def _reset(self, rng: random.Random) -> tuple[str, float]:
        proxy, secs = self._proxy(rng), rng.uniform(1.0, 4.0)
        with self.s.proxy.toxic(proxy, "chaos-reset", "reset_peer", timeout=rng.randint(0, 500)):
            time.sleep(secs)
        return f"{proxy} reset", secs

    def _partition(self, rng: random.Random) -> tuple[str, float]:
        proxy, secs = self._proxy(rng), rng.uniform(3.0, 25.0)
        with self.s.proxy.disabled(proxy):
            time.sleep(secs)
        return f"{proxy} cut", secs


def _unfinished(harness: Settings, runs: list[str]) -> list[str]:
    import redis

    client = redis.Redis.from_url(harness.redis_url)
    try:
        states = RedisStore(client, harness.redis_prefix).load_states(runs)
    finally:
        client.close()
    return [r for r in runs if r not in states or states[r].status not in _TERMINAL]


def run_chaos(opts: ChaosOptions, say: Callable[[str], None]) -> ChaosResult:
    """Run it (see the module's docstring); ``say`` gets the progress lines. Every process it starts
    carries its mark, and is SIGKILLed should this process be killed before it stops them
    (:class:`~runlog.processors.chaos.reaper.Reaper`)."""
    with Reaper() as reaper:
        return _run_chaos(opts, say, reaper)


def _run_chaos(opts: ChaosOptions, say: Callable[[str], None], reaper: Reaper) -> ChaosResult:
    seed = opts.seed if opts.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    t_start = time.monotonic()
    opts.workdir.mkdir(parents=True, exist_ok=True)
    services = Services(opts.workdir / "services", reaper=reaper)
    say(f"chaos: seed {seed}, {opts.duration:.0f}s of faults, {opts.in_flight} runs in flight, "
        f"files in {opts.workdir}")
    services.start()
    server = serve(opts.workdir / "world")
    world_url = f"http://127.0.0.1:{server.server_address[1]}"
    base = Settings.from_env().with_(topic_prefix="", redis_prefix="chaos", lease_ttl_ms=opts.lease_ttl_ms,
                                     artifact_root=str(opts.workdir / "artifacts"))
    harness = services.settings(base, None)
    ensure_topics(harness)
    envs = {role: _env(services.settings(base, role), world_url, reaper) for role in ROLES}
    say(f"chaos: broker {services.internal}, redis {services.redis_direct}, world {world_url}, "
        f"toxiproxy {services.proxy.url}")
    fleet = Fleet({r: envs[r] for r in ("resumer", "projector")}, opts.workdir / "logs")
    for role in ("resumer", "resumer", "projector"):
        fleet.start(role)
    workload = Workload(envs["worker"], harness, opts.workdir / "workers", rng, in_flight=opts.in_flight,
                        world_dir=opts.workdir / "world")
    schedule = plan(rng, opts.duration, gap=opts.gap, kinds=opts.kinds)
    scheduler = Scheduler(schedule, _Actions(services, fleet, workload).table(), rng, say=lambda m: say(
        f"[{time.monotonic() - t_start:7.0f}s] {m}"))
    try:
        scheduler.start()
        t0, last_note = time.monotonic(), 0.0
        while time.monotonic() - t0 < opts.duration:
            workload.tick()
            fleet.replace_dead()
            if time.monotonic() - last_note >= 60:
                last_note = time.monotonic()
                say(f"[{last_note - t_start:7.0f}s] runs started {workload.started()}, faults "
                    f"{sum(scheduler.injected_by_kind().values())}, resumers {len(fleet.alive('resumer'))}, "
                    f"projectors {len(fleet.alive('projector'))}")
            time.sleep(1.0)
        say(f"[{time.monotonic() - t_start:7.0f}s] stopping faults and new runs; settling")
        scheduler.stop()
        services.proxy.reset()
        deadline = time.monotonic() + opts.settle
        while True:
            workload.tick(start=False)
            fleet.replace_dead()
            runs = list(workload.runs)
            left = _unfinished(harness, runs) if runs else []
            if not workload.alive() and not left:
                break
            if time.monotonic() > deadline:
                say(f"chaos: settle ended with {len(workload.alive())} workers alive and {len(left)} runs "
                    "not ended")
                break
            time.sleep(2.0)
        for w in workload.alive():
            w.proc.kill()
        time.sleep(3.0)  # the projector's last batch
        say(f"[{time.monotonic() - t_start:7.0f}s] counting")
        count = gather(harness, opts.workdir / "world", workload.acks_files())
        worker_ends = workload.worker_ends()
    finally:
        scheduler.stop(timeout=1)
        for w in workload.alive():
            w.proc.kill()
        fleet.stop_all()
        server.shutdown()
        server.server_close()
        services.stop()
    return ChaosResult(opts, seed, time.monotonic() - t_start, workload.started(), len(workload.signalled),
                       dict(workload.resolved),
                       scheduler.injected_by_kind(), scheduler.failed_by_kind(), count, fleet.exit_codes(),
                       worker_ends, fleet.died(), [vars(f) for f in scheduler.faults])
