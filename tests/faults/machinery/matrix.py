"""The crash matrix: kill a demo worker at every boundary of its run, resume it, check the outcome.

Each point gets a fresh demo world (its own SQLite files) so what a crashed and
resumed run caused outside is counted for that run alone. The worker is a real
subprocess (:mod:`runlog.processors.demo.worker`) that SIGKILLs itself at the point;
the resume goes through the resume topic and a :class:`ResumerService` (the
resumer consumer group), never a shortcut. One service serves every point: a
routing world client points the demo tools at the world of the run it resumes.

Checks per point: the log ends where the point says (nothing acknowledged is
lost), the run completes, the platform holds exactly one article, every image
is billed and stored once, no ``NEVER`` tool ran, the final artifacts hash like
an uncrashed run's in the same outside world, and search ran again only where
its result was never recorded. The Redis projection is compared with a rebuild
from the log once for all points (:func:`projection_mismatches`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import redis

from runlog.processors.chaos.count import projection_differences
from runlog.processors.demo.client import WorldClient
from runlog.processors.demo.pipeline import build, charge_workflow, source
from runlog.processors.demo.world import serve
from runlog.processors.inspect import LoggedEvent, run_history
from runlog.processors.resume import App, ResumeOutcome, ResumerService, request_resume
from runlog.producers.log._lease import lease_key
from runlog.projections import OutcomeKind, RunStatus
from runlog.schemas import RunlogError, Settings
from runlog.schemas._redis import redis_client
from tests import _fork as fork
from tests.faults.machinery.points import Boundary, boundaries, expected_prefix
from tests.faults.machinery.report import PointEntry

__all__ = [
    "CONTENT_EXPECT",
    "CrashMatrix",
    "Expectations",
    "MatrixError",
    "Reference",
    "RoutingWorld",
    "projection_mismatches",
    "start_projector",
    "worker_env",
]

ROOT = Path(__file__).resolve().parents[3]


class MatrixError(RunlogError):
    """The matrix could not run a point (a service did not answer in time)."""


@dataclass(frozen=True)
class Expectations:
    """What the outside world must hold after a run of the workflow, crashed or not."""

    publishes: int = 1
    renders_billed: int = 3
    assets: int = 3
    charges: int = 0
    research_calls: int = 1
    effects: int = 4
    """Closed effects in the ledger (3 uploads, 1 publish)."""


CONTENT_EXPECT = Expectations()


class RoutingWorld(WorldClient):
    """A world client whose base URL follows the run being resumed (one world per point)."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:9")
        self.urls: dict[str, str] = {}

    def select(self, run_id: str) -> bool:
        """The resumer's ``accept``: point the tools at this run's world; False for strangers."""
        url = self.urls.get(run_id)
        if url is None:
            return False
        self.base_url = url
        return True


def worker_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment of a Runlog subprocess using ``settings`` (no stray ``RUNLOG_*``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNLOG_")}
    env.update(settings.with_(metrics_port=0).to_env())
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    env.update(extra)
    return env


def start_projector(settings: Settings, app_id: str, log: Path) -> subprocess.Popen[bytes]:
    """``runlog project`` as a real process (stop it with SIGTERM or SIGKILL)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as err:
        return subprocess.Popen([sys.executable, "-m", "runlog", "project", "--app-id", app_id,
                                 "--within", "0.2"],
                                cwd=ROOT, env=worker_env(settings), stdout=subprocess.DEVNULL, stderr=err)


def slug(point: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", point).strip("_")


@dataclass
class Reference:
    """An uncrashed run: its boundaries, final artifact hashes and outside-world figures."""

    run_id: str
    events: list[Boundary]
    hashes: dict[str, str]
    stats: dict[str, int]


@dataclass
class _Crashed:
    run_id: str | None
    exit_code: int
    log: list[LoggedEvent] = field(default_factory=list)
    world: ThreadingHTTPServer | None = None
    url: str = ""


class CrashMatrix:
    """Runs crash points of the content workflow against the real broker and Redis.

    Args:
        settings: services and names (topics must exist); a short ``lease_ttl_ms``
            (1000-2000) keeps each point at a few seconds.
        workdir: each point's world and worker log go under it.
    """

    def __init__(self, settings: Settings, workdir: Path, *, workflow: str = "content",
                 params: str = '{"seed": 7}', expect: Expectations = CONTENT_EXPECT,
                 sdk: str = "sync") -> None:
        self.settings = settings
        self.sdk = sdk
        """``sync``: workers run the Runner; ``async``: the AsyncRunner (the resumers stay sync)."""
        self.workdir = workdir
        self.workflow = workflow
        self.params = params
        self.expect = expect
        self.redis = redis_client(settings)
        self.router = RoutingWorld()
        wf, tools = build(self.router)
        checkout, charge = charge_workflow(self.router)
        self.app = App.of([wf, checkout], [*tools, charge], source())
        self.outcomes: list[ResumeOutcome] = []
        self.contended = 0
        """Resumes of the matrix that answered ``contended`` and were retried by the service."""
        self.service = ResumerService(
            settings.with_(resumer_group=f"{settings.topic_prefix}faults-resumer", sweep_interval_ms=0),
            self.app, accept=self.router.select, on_outcome=self.outcomes.append)
        self.run_ids: list[str] = []
        self._servers: list[ThreadingHTTPServer] = []
        self._point_worlds: dict[str, ThreadingHTTPServer] = {}

    def close(self) -> None:
        try:
            self.service.close()
        finally:
            for s in self._servers:
                s.shutdown()
                s.server_close()
            self._servers.clear()
            self.redis.close()

    def __enter__(self) -> CrashMatrix:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- pieces -------------------------------------------------------------------------------

    def world(self, name: str) -> tuple[ThreadingHTTPServer, str]:
        server = serve(self.workdir / name / "world")
        self._servers.append(server)
        url = f"http://127.0.0.1:{server.server_address[1]}"
        # a world shut down after its point frees its port, and a later world may take it: that
        # world has another account, so the router must not answer with the one it cached
        self.router.forget(url)
        return server, url

    def _epoch_runs(self) -> set[str]:
        pat = f"{self.settings.redis_prefix}:{{run-*}}:epoch"
        cut = len(self.settings.redis_prefix) + 2
        return {k.decode()[cut:-len("}:epoch")] for k in self.redis.scan_iter(match=pat, count=1000)}

    def worker(self, url: str, crash_at: str | None, log: Path) -> tuple[str | None, int]:
        """Run one worker subprocess; returns (run id, exit code). The run id of a worker that
        died before printing it is the run whose lease epoch appeared meanwhile."""
        before = self._epoch_runs()
        env = worker_env(self.settings, RUNLOG_DEMO_WORLD_URL=url)
        if crash_at:
            env["RUNLOG_CRASH_AT"] = crash_at
        args = ["--sdk", self.sdk, "--workflow", self.workflow, "--params", self.params]
        proc = fork.start("runlog.processors.demo.worker", args, env, ROOT)
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(out + err)
        run_id = next((line.split("=", 1)[1] for line in out.splitlines()
                       if line.startswith("run_id=")), None)
        if run_id is None:
            new = sorted(self._epoch_runs() - before)
            run_id = new[0] if len(new) == 1 else None
        assert proc.returncode is not None
        return run_id, proc.returncode

    def wait_lease_gone(self, run_id: str, timeout_s: float | None = None) -> float:
        key = lease_key(self.settings.redis_prefix, run_id)
        limit = timeout_s if timeout_s is not None else self.settings.lease_ttl_ms / 1000 * 4 + 2
        t0 = time.monotonic()
        while self.redis.exists(key):
            if time.monotonic() - t0 > limit:
                raise MatrixError(f"the lease of {run_id} did not expire in {limit:.0f}s")
            time.sleep(0.05)
        return time.monotonic() - t0

    def resume(self, run_id: str, timeout_s: float = 90.0, *, request: bool = True) -> ResumeOutcome:
        """Request a resume on the topic (unless one is already there) and let the resumer
        group handle it."""
        if request:
            request_resume(self.settings, run_id, "fault suite: worker killed", requested_by="faults",
                           producer=self.service.producer)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            # a contended resume (another holder, or this resume's own lease starved on a loaded
            # machine: a 1 s ttl here) is retried by the service, as ``runlog resumer`` does; the
            # outcome that counts is the one after it
            self.service.run_due_retries()
            self.service.poll_once(0.2)
            for o in list(self.outcomes):
                if o.run_id == run_id:
                    self.outcomes.remove(o)
                    if o.result == "contended":
                        self.contended += 1
                        continue
                    return o
        raise MatrixError(f"the resumer did not handle the request for {run_id} in {timeout_s:.0f}s")

    def crashing_resumer(self, run_id: str, url: str, crash_at: str, log: Path, *,
                         idle_exit_s: float = 10.0) -> int:
        """``runlog resumer`` as a subprocess in its own group, SIGKILLing itself at ``crash_at``
        while it resumes; returns its exit code (-9 when the point was reached)."""
        env = worker_env(self.settings, RUNLOG_DEMO_WORLD_URL=url, RUNLOG_CRASH_AT=crash_at,
                         RUNLOG_SWEEP_INTERVAL_MS="0",
                         RUNLOG_RESUMER_GROUP=f"{self.settings.topic_prefix}crashing-{uuid.uuid4().hex[:6]}")
        proc = subprocess.run([sys.executable, "-m", "runlog", "resumer", "--app",
                               "runlog.processors.demo.pipeline:app", "--idle-exit", str(idle_exit_s)],
                              env=env, cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(proc.stdout + proc.stderr)
        return proc.returncode

    def double_crash(self, first: str, second: str, ref: Reference) -> PointEntry:
        """Kill the worker at ``first``, kill the resumer at ``second`` during its resume, then let
        a clean member of the resumer group (which never committed the request) finish the run."""
        label = f"{first} + resume {second}"
        entry, crashed, client = self.crash(first, ref, name=slug(label))
        entry.point = label
        if entry.run_id is None or not crashed:
            entry.checks["run_exists"] = False
            return self._finish(entry, time.monotonic() - entry.seconds)
        t0 = time.monotonic() - entry.seconds
        request_resume(self.settings, entry.run_id, "fault suite: worker killed", requested_by="faults",
                       producer=self.service.producer)
        rc = self.crashing_resumer(entry.run_id, client.base_url, second,
                                   self.workdir / slug(entry.point) / "resumer.log")
        entry.detail["resumer_exit"] = rc
        entry.checks["resumer_killed_at_point"] = rc == -9
        entry.detail["events_at_second_crash"] = len(run_history(self.settings, entry.run_id))
        self.wait_lease_gone(entry.run_id)
        self.run_ids.append(entry.run_id)
        outcome = self.resume(entry.run_id, request=False)
        entry.detail["resume"] = outcome.result
        entry.detail["resume_epoch"] = outcome.epoch
        entry.detail["effects_on_resume"] = [e.action for e in outcome.plan.effects]
        self.check_final(entry, client, ref, crashed)
        self._point_worlds[entry.point] = self._point_worlds.pop(first)
        return self._finish(entry, t0)

    def final_hashes(self, history: Sequence[LoggedEvent]) -> dict[str, str]:
        state = history[-1].state
        return {stage: ref.sha256 for stage, ref in sorted(state.stage_outputs.items())}

    def reference(self, name: str = "reference", prepare: Callable[[WorldClient], None] | None = None
                  ) -> Reference:
        """An uncrashed run in a fresh world (``prepare`` may touch the world first)."""
        _, url = self.world(name)
        client = WorldClient(url)
        if prepare is not None:
            prepare(client)
        run_id, rc = self.worker(url, None, self.workdir / name / "worker.log")
        if rc != 0 or run_id is None:
            raise MatrixError(f"the reference run did not complete (exit {rc})")
        history = run_history(self.settings, run_id)
        self.run_ids.append(run_id)
        return Reference(run_id, boundaries([le.event for le in history]), self.final_hashes(history),
                         client.stats())

    # -- one point ----------------------------------------------------------------------------

    def crash(self, point: str, ref: Reference, *, name: str | None = None
              ) -> tuple[PointEntry, list[LoggedEvent], WorldClient]:
        """Phase 1 of a point: a fresh world, a worker killed at ``point``, its lease expired."""
        t0 = time.monotonic()
        name = name or slug(point)
        server, url = self.world(name)
        self._point_worlds[point] = server
        client = WorldClient(url)
        entry = PointEntry(point, "FAILED")
        run_id, rc = self.worker(url, point, self.workdir / name / "worker.log")
        entry.run_id = run_id
        entry.detail["worker_exit"] = rc
        checks = entry.checks
        checks["killed_at_point"] = rc == -9
        crashed = run_history(self.settings, run_id) if run_id else []
        want = expected_prefix(point, ref.events)
        got = boundaries([le.event for le in crashed])
        matched = 0
        for a, b in zip(got, ref.events[:want], strict=False):
            if a != b:
                break
            matched += 1
        checks["log_ends_at_point"] = len(got) == want and matched == want
        entry.lost_events = want - matched
        entry.detail["events_at_crash"] = len(got)
        entry.detail["stats_at_crash"] = client.stats()
        if crashed and run_id is not None:
            self.router.urls[run_id] = url
            entry.detail["lease_wait_s"] = round(self.wait_lease_gone(run_id), 3)
        entry.seconds = time.monotonic() - t0
        return entry, crashed, client

    def finish_point(self, entry: PointEntry, crashed: list[LoggedEvent], client: WorldClient,
                     ref: Reference, *, research_calls_allowed: int = 1,
                     hashes: dict[str, str] | None = None) -> PointEntry:
        """Phase 2 of a point: resume through the resumer group, then every check."""
        t0 = time.monotonic() - entry.seconds
        if not crashed:
            # Died before RUN_STARTED was acknowledged: no run exists and nothing happened outside.
            stats = client.stats()
            entry.checks["world_untouched"] = not any(stats.values())
            entry.outcome = "no_run"
            entry.detail["stats"] = stats
            return self._finish(entry, t0)
        assert entry.run_id is not None
        self.run_ids.append(entry.run_id)
        outcome = self.resume(entry.run_id)
        entry.detail["resume"] = outcome.result
        entry.detail["resume_epoch"] = outcome.epoch
        cp = outcome.plan.checkpoint
        entry.detail["checkpoint"] = cp.checkpoint_id if cp else None
        entry.detail["effects_on_resume"] = [e.action for e in outcome.plan.effects]
        entry.detail["reused_calls"] = len(outcome.plan.reused_calls)
        self.check_final(entry, client, ref, crashed, research_calls_allowed=research_calls_allowed,
                         hashes=hashes)
        return self._finish(entry, t0)

    def run_point(self, point: str, ref: Reference, *, research_calls_allowed: int = 1,
                  hashes: dict[str, str] | None = None) -> PointEntry:
        """Kill a worker at ``point``, resume it through the resumer group and check everything."""
        entry, crashed, client = self.crash(point, ref)
        return self.finish_point(entry, crashed, client, ref, research_calls_allowed=research_calls_allowed,
                                 hashes=hashes)

    def run_points(self, points: Sequence[str], ref: Reference, *, concurrency: int = 2,
                   allow: Callable[[str], tuple[int, dict[str, str] | None]] | None = None,
                   progress: Callable[[PointEntry], None] | None = None) -> list[PointEntry]:
        """Every point: crashes run ``concurrency`` at a time ahead of the (sequential) resumes.

        Points that kill the worker around ``RUN_STARTED`` run alone first: their run id is
        found by the lease epoch that appeared, which needs no other worker running.
        """
        alone = [p for p in points if ":RUN_STARTED:" in p]
        rest = [p for p in points if p not in alone]
        out: list[PointEntry] = []

        def done(e: PointEntry) -> None:
            out.append(e)
            if progress is not None:
                progress(e)

        def opts(p: str) -> tuple[int, dict[str, str] | None]:
            return allow(p) if allow is not None else (1, None)

        for p in alone:
            n, h = opts(p)
            done(self.run_point(p, ref, research_calls_allowed=n, hashes=h))
        with ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="crash") as pool:
            for p, (entry, crashed, client) in zip(rest, pool.map(lambda x: self.crash(x, ref), rest),
                                                   strict=True):
                n, h = opts(p)
                done(self.finish_point(entry, crashed, client, ref, research_calls_allowed=n, hashes=h))
        order = {p: i for i, p in enumerate(points)}
        return sorted(out, key=lambda e: order[e.point])

    def check_final(self, entry: PointEntry, client: WorldClient, ref: Reference,
                    crashed: Sequence[LoggedEvent], *, research_calls_allowed: int = 1,
                    hashes: dict[str, str] | None = None) -> None:
        """The checks after a resume: completion, outside world, artifacts, log integrity."""
        assert entry.run_id is not None
        e, checks = self.expect, entry.checks
        history = run_history(self.settings, entry.run_id)
        state = history[-1].state
        stats = client.stats()
        entry.detail["stats"] = stats
        entry.completed = state.status is RunStatus.COMPLETED
        checks["completed"] = entry.completed
        checks["one_article"] = stats["publishes"] == e.publishes
        checks["renders_billed_once"] = stats["renders_billed"] == e.renders_billed
        checks["assets_stored_once"] = stats["assets"] == e.assets
        checks["never_tool_not_rerun"] = stats["charges"] <= e.charges
        checks["research_calls"] = e.research_calls <= stats["research_calls"] <= research_calls_allowed
        checks["artifacts_equal_reference"] = self.final_hashes(history) == (hashes or ref.hashes)
        accepted = [le for le in history if le.outcome.kind is OutcomeKind.ACCEPTED]
        checks["seq_gapless"] = [le.event.seq for le in accepted] == list(range(1, len(accepted) + 1))
        checks["nothing_rejected"] = len(accepted) == len(history)
        checks["effects_closed"] = not state.open_effects and len(state.closed_effects) == e.effects
        kept = {(le.event.seq, le.event.type) for le in accepted}
        entry.lost_events += sum(1 for le in crashed if (le.event.seq, le.event.type) not in kept)
        entry.duplicate_effects = (max(0, stats["publishes"] - e.publishes)
                                   + max(0, stats["assets"] - e.assets)
                                   + max(0, stats["charges"] - e.charges))
        entry.duplicate_renders = max(0, stats["renders_billed"] - e.renders_billed)
        entry.detail["events"] = len(history)
        entry.detail["epochs"] = sorted({le.event.epoch for le in history})
        entry.outcome = "completed" if entry.completed else state.status.value.lower()

    def _finish(self, entry: PointEntry, t0: float) -> PointEntry:
        server = self._point_worlds.pop(entry.point, None)
        if server is not None:
            server.shutdown()
            server.server_close()
            self._servers.remove(server)
        entry.failures = sorted(k for k, v in entry.checks.items() if not v)
        if entry.failures or entry.lost_events:
            entry.outcome = "FAILED" if entry.outcome in ("completed", "no_run") else entry.outcome
            if entry.lost_events and "lost_events" not in entry.failures:
                entry.failures.append("lost_events")
        entry.seconds = round(time.monotonic() - t0, 3)
        return entry


# -- the projection against a rebuild ------------------------------------------------------


def _last_offsets(settings: Settings, run_ids: Iterable[str]) -> dict[str, int]:
    out = {}
    for r in run_ids:
        h = run_history(settings, r)
        if h:
            out[r] = h[-1].offset
    return out


def projection_mismatches(settings: Settings, client: redis.Redis, run_ids: Sequence[str], *,
                          timeout_s: float = 60.0) -> tuple[dict[str, list[str]], list[str]]:
    """Wait for the live projection to reach every run's last event, rebuild the log into a
    fresh namespace and compare (:func:`runlog.processors.chaos.count.projection_differences`, what
    ``runlog chaos`` counts): (differing keys per run, differing global keys)."""
    diffs, _, _ = projection_differences(client, settings, _last_offsets(settings, run_ids),
                                         timeout_s=timeout_s)
    per_run = {r: [k for k in diffs if k.startswith(f"{{{r}}}:")] for r in run_ids}
    glob = [k for k in diffs if k.startswith(("runs:by_status:", "{idx:")) or k == "effects:by_key"]
    return per_run, glob


def describe(entry: PointEntry) -> str:
    bad = ", ".join(entry.failures) or "ok"
    return f"{entry.point:<48} {entry.outcome:<10} {entry.seconds:5.1f}s {bad}"


def summary(entries: Sequence[PointEntry]) -> dict[str, Any]:
    return {"points": len(entries), "failed": [e.point for e in entries if e.failures]}
