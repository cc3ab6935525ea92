"""Issue #17's acceptance on the local Redis Cluster: a master SIGKILLed under load, nothing lost,
nothing twice.

A stream of runs of the ``shipment`` workflow (``_stream.py``: an IDEMPOTENT reservation and a
RECONCILE_FIRST label, both counted by the demo world's services in their own SQLite files) runs on
a Runner in this process, ten at a time, with a projector and a resumer (``runlog project``,
``runlog resumer``: real processes) on the cluster. Some orders are submitted a second time, as a
second run, once their first run completed: only the effects ledger (a claim, or the projected index
when the claim is gone) stops that run from reserving and shipping again. While runs are in flight,
the master owning an in-flight run's lease is SIGKILLed (``deploy/local/redis-cluster kill N``); its
replica is promoted, runs whose lease expired meanwhile are resumed by the resumer's sweep.

Then: every run on the log is COMPLETED there and in the projection; every reservation and every
label exists exactly once in the world, and every run of an order recorded that one external id;
every completion a writer was told of is on the log; the projection equals a rebuild of the log
(``runlog projections rebuild --diff``). The killed node is started again at the end.

Bypass the ledger (``RedisEffectLedger.open`` answering None) and the second runs reserve and ship
again: the counts fail (checked by hand against the stream without a kill, which passes). Lose an
acknowledged event and the rebuild, the statuses or the acknowledged completions fail. Every
property is checked and all that failed are listed at once.

Interruptions a failover may cause and the protocol absorbs are allowed: a writer that lost its
lease (heartbeats unanswered for a ttl) stops and its run is resumed; a start refused meanwhile is
tried again with the same idempotency key. A projection write lost to the failover is not: the
projector's applies wait for a replica of each primary they wrote to (``RUNLOG_REDIS_WAIT_REPLICAS``
auto, :mod:`runlog.projections._replicas`), so a run state or a global-index entry (``{idx:<n>}`` keys)
that differs from a rebuild fails the test like anything else.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis

from runlog.processors.demo.client import WorldClient
from runlog.processors.demo.run import worker_env
from runlog.producers import Runner
from runlog.producers.log._lease import lease_key
from runlog.producers.run._active import ActiveRuns
from runlog.projections import RedisStore, RunStatus
from runlog.schemas import EventType, Settings
from runlog.schemas._redis import redis_client
from tests.integration.cluster import _stream
from tests.integration.processors.harness import converges, reference, start_projector, stop, wait_until
from tests.integration.producers.helpers import read_events
from tests.integration.resume.conftest import DemoWorld, served_world

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]

ORDERS = 30
"""Orders of the stream: one run each."""
AGAIN = 8
"""The first orders to complete are submitted again, as a second run (the ledger's part)."""
CONCURRENCY = 10
PAUSE_S = 0.5
"""Each of the stages ``reserve`` and ``pack`` sleeps this long: runs are in flight for a while."""
KILL_AFTER = 6
"""Completed runs before the master is killed."""


def _cluster_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ROOT / "deploy" / "local" / "redis-cluster"), *args], capture_output=True,
                          text=True, timeout=300, check=False)


def _node_number(port: int) -> int:
    return port - int(os.environ.get("RUNLOG_REDIS_CLUSTER_PORT") or 17001) + 1


def _replicas_linked(c: Any) -> bool:
    """Whether every master has a replica whose link to it is up."""
    for primary in c.get_primaries():
        node = redis.Redis(host=primary.host, port=int(primary.port))
        try:
            info = node.info("replication")
        except redis.RedisError:
            return False
        finally:
            node.close()
        if not info.get("connected_slaves") or info.get("slave0", {}).get("state") != "online":
            return False
    return True


def _restart(n: int) -> None:
    """Start node ``n`` again and wait until it follows its new master (the next test may kill that)."""
    proc = _cluster_script("start", str(n))
    assert proc.returncode == 0, proc.stderr
    node = redis.Redis(port=int(os.environ.get("RUNLOG_REDIS_CLUSTER_PORT") or 17001) + n - 1)
    try:
        linked = wait_until(lambda: node.info("replication").get("master_link_status") == "up", 60, every=0.5)
        assert linked, f"node {n} did not rejoin as a replica: {node.info('replication')}"
    finally:
        node.close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[DemoWorld]:
    with served_world(tmp_path / "world") as w:
        yield w


class Stream:
    """The runs this process executes: submitted to a pool, their outcomes as the writer saw them."""

    def __init__(self, runner: Runner, world: WorldClient) -> None:
        self.runner = runner
        self.wf = _stream.stream_app(world).registry.get(_stream.WORKFLOW)
        self.pool = ThreadPoolExecutor(CONCURRENCY, thread_name_prefix="stream")
        self.lock = threading.Lock()
        self.futures: list[Future[None]] = []
        self.completed: dict[str, tuple[str, int, int]] = {}
        """run id -> (order, epoch, last seq) of runs the Runner returned completed."""
        self.handed_over: list[tuple[str, str]] = []
        """(order, key) of starts that found their run already there (a retried start)."""
        self.errors: list[tuple[str, str]] = []
        """(order, error) of runs that raised: left to the resumer."""
        self.again: list[str] = []
        self.order_of: dict[str, str] = {}
        """run id -> order, of every run a start returned (a retried start returns the same run)."""

    def submit(self, order: str, key: str) -> None:
        with self.lock:
            self.futures.append(self.pool.submit(self._one, order, key))

    def _one(self, order: str, key: str) -> None:
        params = {"order": order, "pause": PAUSE_S}
        for attempt in range(60):  # a start refused while the cluster fails over is tried again
            try:
                handle = self.runner.start_run(self.wf, params, idempotency_key=key)
                break
            except Exception as err:  # noqa: BLE001 - recorded; the same key finds the same run
                with self.lock:
                    self.errors.append((order, f"start attempt {attempt}: {err!r}"))
                time.sleep(0.5)
        else:
            return
        with self.lock:
            self.order_of[handle.run_id] = order
        if handle.session is None:
            with self.lock:
                self.handed_over.append((order, key))
            return
        try:
            result = self.runner.execute(handle.session)
        except Exception as err:  # noqa: BLE001 - the run stays RUNNING on the log: the resumer's
            with self.lock:
                self.errors.append((order, f"{handle.run_id}: {err!r}"))
            return
        assert result.completed
        with self.lock:
            self.completed[result.run_id] = (order, result.epoch, result.last_seq)
            if key == order and len(self.again) < AGAIN:
                self.again.append(order)
                self.futures.append(self.pool.submit(self._one, order, f"{order}/again"))

    def done(self) -> bool:
        with self.lock:
            return all(f.done() for f in self.futures)

    def close(self) -> None:
        for f in self.futures:
            f.result()  # a bug in _one itself
        self.pool.shutdown()


def _world_counts(root: Path) -> tuple[dict[str, int], dict[str, set[str]],
                                      dict[str, int], dict[str, set[str]]]:
    """From the services' own files: reservations per order and their asset ids, labels per order and
    their article ids."""
    names = [f"o-{i:02d}" for i in range(ORDERS)]
    by_sha = {hashlib.sha256(_stream.reservation(o)).hexdigest(): o for o in names}
    reservations: Counter[str] = Counter()
    assets: dict[str, set[str]] = defaultdict(set)
    with sqlite3.connect(root / "assets.db") as db:
        for sha, asset_id in db.execute("SELECT sha256, asset_id FROM assets"):
            order = by_sha.get(sha, f"unknown {sha}")
            reservations[order] += 1
            assets[order].add(asset_id)
    labels: Counter[str] = Counter()
    articles: dict[str, set[str]] = defaultdict(set)
    with sqlite3.connect(root / "platform.db") as db:
        for art_id, title in db.execute("SELECT id, title FROM articles"):
            order = title.removeprefix("order ")
            labels[order] += 1
            articles[order].add(f"art-{art_id}")
    return dict(reservations), assets, dict(labels), articles


def test_a_master_sigkilled_under_a_stream_of_runs_loses_nothing_and_does_nothing_twice(
        topics: Settings, world: DemoWorld, tmp_path: Path) -> None:
    if os.environ.get("RUNLOG_TEST_REDIS_CLUSTER_URL"):
        pytest.skip("a cluster from RUNLOG_TEST_REDIS_CLUSTER_URL is not ours to kill nodes of")
    problems = stream_of_runs(topics, world, tmp_path, kill=True)
    assert not problems, "\n".join(problems)


def test_the_stream_without_a_kill_loses_nothing_and_does_nothing_twice(
        topics: Settings, world: DemoWorld, tmp_path: Path) -> None:
    """The baseline (and a check of the checks): every property holds
    when no node dies; with the ledger bypassed, the second runs' effects are counted twice."""
    problems = stream_of_runs(topics, world, tmp_path, kill=False)
    assert not problems, "\n".join(problems)


def stream_of_runs(topics: Settings, world: DemoWorld, tmp_path: Path, *, kill: bool) -> list[str]:
    """The stream (see the module docstring), killing a master when ``kill``; what went wrong, each
    property checked once everything settled (the log, the world, the projection, the processes)."""
    t0 = time.monotonic()
    s = topics.with_(sweep_interval_ms=1000, resumer_group=f"t-resumer-{uuid.uuid4().hex[:8]}",
                     demo_world_url=world.url)
    orders = [f"o-{i:02d}" for i in range(ORDERS)]
    c = redis_client(s)
    store = RedisStore(c, s.redis_prefix)
    active = ActiveRuns(c, s.redis_prefix)
    proj_log, res_log = tmp_path / "projector.log", tmp_path / "resumer.log"
    projector = start_projector(s, f"{s.topic_prefix}proj", log=proj_log)
    resumers: list[subprocess.Popen[bytes]] = []
    problems: list[str] = []

    def start_resumer() -> None:
        with open(res_log, "ab") as err:
            resumers.append(subprocess.Popen(
                [sys.executable, "-m", "runlog", "resumer", "--app", f"{_stream.__name__}:app"],
                cwd=ROOT, env=worker_env(s, world.url), stdout=subprocess.DEVNULL, stderr=err))

    def supervise() -> None:  # a supervisor starts a resumer that exited again: so does the test
        if resumers[-1].poll() is not None:
            start_resumer()

    start_resumer()
    killed: int | None = None
    in_flight: list[str] = []
    on_killed: list[str] = []
    timings: dict[str, float] = {}
    try:
        if kill:  # a replica that never synced refuses to take over (replica validity)
            assert wait_until(lambda: _replicas_linked(c), 60, every=0.5), "replicas not linked"
        with Runner.from_settings(s) as runner:
            stream = Stream(runner, world.client)
            for order in orders:
                stream.submit(order, order)
            # -- kill the master of an in-flight run's lease, with runs in flight
            assert wait_until(lambda: len(stream.completed) >= KILL_AFTER or len(stream.errors) > 3, 120,
                              every=0.05)
            assert len(stream.completed) >= KILL_AFTER, stream.errors
            def flying() -> list[str]:
                return [r for r, _ in active.list() if r not in stream.completed]

            wait_until(lambda: len(flying()) >= 3, 30, every=0.05)  # most of the ten, as a rule
            in_flight = flying()
            assert in_flight, "no run in flight to kill a master under"
            if kill:
                victim = lease_key(s.redis_prefix, in_flight[0])
                node = c.get_node_from_key(victim)
                killed = _node_number(int(node.port))
                on_killed = [r for r in in_flight
                             if c.get_node_from_key(lease_key(s.redis_prefix, r)).port == node.port]
                assert _cluster_script("kill", str(killed)).returncode == 0
                timings["killed"] = time.monotonic() - t0

                def promoted() -> bool:
                    supervise()
                    try:
                        c.nodes_manager.initialize()
                        return int(c.get_node_from_key(victim).port) != int(node.port)
                    except Exception:  # noqa: BLE001 - the cluster is between states
                        return False

                assert wait_until(promoted, 60, every=0.5), "no replica was promoted within 60 s"
                timings["promoted"] = time.monotonic() - t0
            deadline = time.monotonic() + 120
            while not stream.done():
                assert time.monotonic() < deadline, "runs of the stream still running after 120 s"
                supervise()
                time.sleep(0.2)
            stream.close()
            timings["stream done"] = time.monotonic() - t0

        # -- the resumer finishes what the failover interrupted; the projector catches up. Waits
        # until every run is COMPLETED, or nothing changed for 30 s.
        expected = len(orders) + len(stream.again)
        seen: list[Any] = [None, time.monotonic()]

        def settled() -> bool:
            supervise()
            try:
                now = (store.counts(), sorted(r for r, _ in active.list()))
            except Exception:  # noqa: BLE001 - a node still failing over
                return False
            if now != seen[0]:
                seen[:] = [now, time.monotonic()]
            counts, still_active = now
            return (counts[RunStatus.COMPLETED] == expected and not still_active) \
                or time.monotonic() - seen[1] > 30

        wait_until(settled, 150, every=1.0)
        timings["settled"] = time.monotonic() - t0
        counts = {k.value: v for k, v in store.counts().items() if v}
        if counts != {"COMPLETED": expected}:
            problems.append(f"the projection holds {counts}, not {expected} COMPLETED runs; still active: "
                            f"{active.list()}")
        ref = reference(s, c)
        left = converges(s, c, ref, timeout=60)
        if left:
            problems.append(f"the projection differs from a rebuild of the log in {len(left)} keys: "
                            f"{sorted(left)[:50]}")
    finally:
        for p in resumers:
            stop(p)
        stop(projector)
        if killed is not None:
            _restart(killed)
    if len(resumers) > 1:
        problems.append(f"runlog resumer exited {len(resumers) - 1} times: "
                        + "; ".join(line for line in res_log.read_text().splitlines()
                                    if line.startswith(("runlog:", "AssertionError")))[:600])
    crashes = [line[:200] for line in proj_log.read_text().splitlines() if "Crashed reason=" in line]
    if crashes:
        problems.append(f"the projector's agent crashed {len(crashes)} times: {crashes[0]}")
    # A writer whose heartbeats could not reach the failing master for a lease ttl (3 s here, the
    # failover takes about 5 s) stops with LeaseLost: fenced, as it must be; its run is the
    # resumer's (the checks below require it COMPLETED, its effects once). A start refused during
    # the failover is tried again with the same idempotency key (which finds the same run). A
    # writer whose effects-ledger claim hit the failover (LedgerUnavailable: the write not known to
    # be on a replica, or the master gone) lets go of its run as a crash would, appending nothing;
    # the resumer continues it (the checks below require it COMPLETED, its effects once). Any
    # other error is a problem.
    unexpected = [e for e in stream.errors
                  if "LeaseLost" not in e[1] and "LedgerUnavailable" not in e[1]
                  and not e[1].startswith("start attempt")]
    if unexpected:
        problems.append(f"{len(unexpected)} writer errors other than a lost lease: {unexpected[:4]}")

    # -- the log: every run COMPLETED, every completion a writer was told of is there
    events = [x.event for x in read_events(s)]
    runs: dict[str, list[Any]] = defaultdict(list)
    for e in events:
        runs[e.run_id].append(e)
    params = stream.order_of
    if set(runs) != set(params) or len(runs) != expected:
        problems.append(f"{len(runs)} runs on the log, {expected} submitted; runs no start returned: "
                        f"{set(runs) - set(params)}")
    ref_store = RedisStore(c, ref)
    logged = {r: ref_store.load_state(r) for r in runs}
    not_done = {r: (st.status.value if st else None) for r, st in logged.items()
                if st is None or st.status is not RunStatus.COMPLETED}
    if not_done:
        problems.append(f"{len(not_done)} of {len(runs)} runs are not COMPLETED on the log: "
                        f"{dict(Counter(not_done.values()))}")
    twice = [r for r, evs in runs.items() if sum(1 for e in evs if e.type is EventType.RUN_COMPLETED) > 1]
    if twice:
        problems.append(f"runs completed twice on the log: {twice}")
    for run_id, (_, epoch, last_seq) in stream.completed.items():
        if not any(e.type is EventType.RUN_COMPLETED and (e.epoch, e.seq) == (epoch, last_seq)
                   for e in runs[run_id]):
            problems.append(f"{run_id}'s acknowledged completion (epoch {epoch}, seq {last_seq}) is not on "
                            "the log")

    # -- the world: each order reserved once and shipped once, and every run recorded those ids
    reservations, assets, labels, articles = _world_counts(tmp_path / "world")
    for what, counted in (("reservations", reservations), ("labels", labels)):
        wrong = {o: counted.get(o, 0) for o in orders if counted.get(o, 0) != 1}
        extra = set(counted) - set(orders)
        if wrong or extra:
            problems.append(f"{what} not exactly once per order: {wrong} {extra or ''}")
    recorded: dict[tuple[str, str], set[str]] = defaultdict(set)
    for run_id, evs in runs.items():
        for e in evs:
            if e.type in (EventType.EFFECT_RESULT, EventType.EFFECT_RECONCILED) and e.external_id:
                recorded[(params.get(run_id, "?"), e.tool or "")].add(e.external_id)
    for order in orders:
        for tool_name, ids in (("reserve", assets[order]), ("ship", articles[order])):
            if recorded[(order, tool_name)] - ids:
                problems.append(f"{order} {tool_name}: the log records {recorded[(order, tool_name)]}, "
                                f"the world holds {ids}")
    reconciled = [r for r, o in params.items() if o in stream.again and r in runs
                  and any(e.type is EventType.EFFECT_RECONCILED for e in runs[r])]
    if len(reconciled) < len(stream.again):
        problems.append(f"only {len(reconciled)} of the {len(stream.again)} second runs reconciled their "
                        "effects from the ledger")

    # -- the projection equals a rebuild, by the CLI's check too
    proc = subprocess.run([sys.executable, "-m", "runlog", "projections", "rebuild", "--diff"],
                          capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
                          env={**os.environ, **s.to_env()})
    if proc.returncode != 0 or "0 keys differ" not in proc.stdout:
        problems.append(f"runlog projections rebuild --diff: exit {proc.returncode}: {proc.stdout[-300:]}")
    c.close()
    epochs = Counter(max(e.epoch for e in evs) for evs in runs.values())
    print(f"\nfailover stream: {expected} runs ({len(stream.again)} second runs); master node {killed} "
          f"killed with {len(in_flight)} runs in flight ({len(on_killed)} leased on it); timings "
          f"{ {k: round(v, 1) for k, v in timings.items()} }; runs by final epoch {dict(epochs)}; "
          f"handed over {stream.handed_over}; {len(problems)} problems")
    return problems
