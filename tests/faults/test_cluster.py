"""A three-broker cluster loses one broker while 1,000 runs are in flight.

``deploy/local/cluster`` starts three combined broker + controller nodes
(replication factor 3, ``min.insync.replicas=2``, unclean leader election off)
under a private directory. Runs of the checkout workflow (a ``NEVER`` card
charge) are started, then executed by a thread pool through one writer; when a
quarter of them have completed, the broker leading most partitions of the
events topic is SIGKILLed. Protections: acks=all with min ISR 2 (an
acknowledged event is on two brokers before the writer hears of it), the
idempotent producer's retries through the leader election (no duplicate), and
the effect intent confirmed before the charge (no charge on an unconfirmed
intent, none twice).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from runlog.processors.admin import ensure_topics
from runlog.processors.demo.client import WorldClient
from runlog.processors.demo.pipeline import charge_workflow, source
from runlog.processors.demo.world import serve
from runlog.producers import Runner
from runlog.schemas import EventType, Settings, Topics
from tests.faults._support import AckLog, busy_workflow, link_jar_cache, local, topic_events
from tests.faults.machinery.report import PointEntry, write_section

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RUNS = 1_000
THREADS = 48
KILL_AFTER = RUNS // 4
CLUSTER_PORT = "29192"
ENTRIES: list[PointEntry] = []


@pytest.fixture(scope="module", autouse=True)
def _report(fault_report: Path) -> Iterator[None]:
    yield
    if ENTRIES:
        write_section(fault_report, "cluster", ENTRIES)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    ldir = tmp_path_factory.mktemp("cluster")
    link_jar_cache(ldir)
    out = local("cluster", ldir, "up", RUNLOG_CLUSTER_PORT=CLUSTER_PORT)
    bootstrap = out.strip().rsplit("=", 1)[1]
    try:
        yield bootstrap, ldir
    finally:
        local("cluster", ldir, "down", "--kill", "--purge", RUNLOG_CLUSTER_PORT=CLUSTER_PORT)


def _events_partitions(settings: Settings, wait_s: float = 30.0) -> list[Any]:
    """The events topic's partition metadata (leader, replicas, in-sync replicas), once every
    partition has a leader (a topic just created, or a cluster just restarted, may not yet)."""
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap_servers})
    topic = Topics.of(settings).events
    deadline = time.monotonic() + wait_s
    while True:
        parts = list(admin.list_topics(topic, timeout=10).topics[topic].partitions.values())
        if (parts and all(p.leader >= 0 for p in parts)) or time.monotonic() > deadline:
            return parts
        time.sleep(0.2)


def _busiest_leader(settings: Settings) -> tuple[int, int]:
    """The broker leading most partitions of the events topic, and how many it leads."""
    parts = _events_partitions(settings)
    assert all(len(p.replicas) == 3 for p in parts), "events topic is not RF 3"
    return Counter(p.leader for p in parts).most_common(1)[0]


def _under_replicated(settings: Settings) -> int:
    return sum(1 for p in _events_partitions(settings) if len(p.isrs) < len(p.replicas))


def test_one_broker_of_three_killed_with_1000_runs_in_flight(
    settings: Settings, tmp_path: Path, cluster: tuple[str, Path]
) -> None:
    bootstrap, ldir = cluster
    s = settings.with_(kafka_bootstrap_servers=bootstrap, replication_factor=3, min_insync_replicas=2,
                       lease_ttl_ms=30_000)
    ensure_topics(s)
    entry = PointEntry(f"one of three brokers SIGKILLed with {RUNS} runs in flight", "FAILED")
    t0 = time.monotonic()
    server = serve(tmp_path / "world")
    world = WorldClient(f"http://127.0.0.1:{server.server_address[1]}")
    wf, _charge = charge_workflow(world)
    writer = AckLog(s)
    done = threading.Semaphore(0)
    finished: Counter[str] = Counter()
    lock = threading.Lock()
    victim, led = _busiest_leader(s)
    killed_at: dict[str, float] = {}
    try:
        with Runner.from_settings(s, source=source(), writer=writer) as runner:
            handles = [runner.start_run(wf, {"order": f"order-{i:04d}", "cents": 100 + i})
                       for i in range(RUNS)]
            entry.run_id = handles[0].run_id

            def execute(i: int) -> bool:
                session = handles[i].session
                assert session is not None
                try:
                    ok = runner.execute(session).completed
                except Exception as err:  # noqa: BLE001 - counted, and named in the report
                    with lock:
                        finished[f"error: {type(err).__name__}: {err}"[:200]] += 1
                    ok = False
                with lock:
                    finished["completed" if ok else "not_completed"] += 1
                done.release()
                return ok

            with ThreadPoolExecutor(THREADS, thread_name_prefix="run") as pool:
                futures = [pool.submit(execute, i) for i in range(RUNS)]
                for _ in range(KILL_AFTER):
                    assert done.acquire(timeout=300), "runs stopped completing before the kill"
                with lock:
                    in_flight = RUNS - finished["completed"] - finished["not_completed"]
                killed_at["t"] = time.monotonic()
                local("cluster", ldir, "kill", str(victim), RUNLOG_CLUSTER_PORT=CLUSTER_PORT)
                results = [f.result(timeout=600) for f in futures]
            wall = time.monotonic() - t0
    finally:
        writer.close()
        stats = world.stats()
        server.shutdown()
        server.server_close()
    # every event of every run, read back from the two surviving brokers
    events = topic_events(s)
    on_topic = Counter((ev.run_id, ev.seq) for ev in events)
    acked = set(writer.acked)
    run_ids = {h.run_id for h in handles}
    last_type = {}
    for ev in events:
        if ev.run_id in run_ids:
            last_type[ev.run_id] = ev.type
    after_kill = [k for k, at in writer.acked.items() if at >= killed_at.get("t", float("inf"))]
    # the killed broker comes back and catches up from the others
    local("cluster", ldir, "start", str(victim), RUNLOG_CLUSTER_PORT=CLUSTER_PORT)
    deadline = time.monotonic() + 120
    while (urp := _under_replicated(s)) and time.monotonic() < deadline:
        time.sleep(0.5)
    checks = entry.checks
    checks["killed_with_runs_in_flight"] = in_flight >= RUNS // 2
    checks["victim_led_partitions"] = led > 0
    checks["writes_acked_after_kill"] = len(after_kill) > 0
    checks["no_delivery_error"] = not writer.errors
    checks["every_ack_on_topic"] = acked <= set(on_topic)
    checks["no_duplicate_event"] = all(n == 1 for n in on_topic.values())
    checks["every_run_completed"] = all(results) and all(
        last_type.get(r) is EventType.RUN_COMPLETED for r in run_ids)
    checks["each_order_charged_once"] = stats["charges"] == RUNS and stats["charged_references"] == RUNS
    checks["replicas_caught_up_after_restart"] = urp == 0
    entry.completed = checks["every_run_completed"]
    entry.lost_events = len(acked - set(on_topic))
    entry.duplicate_effects = stats["charges"] - stats["charged_references"]
    entry.conclude("completed", t0)
    entry.detail.update({
        "runs": RUNS, "threads": THREADS, "in_flight_at_kill": in_flight, "killed_broker": victim,
        "partitions_it_led": led, "events": len(events), "acked": len(acked),
        "acked_after_kill": len(after_kill), "runs_completed": sum(results), "wall_s": round(wall, 1),
        "charges": stats["charges"], "outcomes": dict(finished), "delivery_errors": writer.errors[:5],
        "under_replicated_after_restart": urp,
    })
    ENTRIES.append(entry)
    assert not entry.failures, (entry.failures, entry.detail)


def test_a_leader_cut_off_from_its_followers_then_killed_loses_no_acknowledged_event(
    settings: Settings, cluster: tuple[str, Path]
) -> None:
    """The hard case for replication: the two other nodes hang (SIGSTOP) while runs write, so the
    leader of some partitions is alone with its log; then it is killed and the others wake up and
    elect new leaders from the followers it left behind. Protection: ``acks=all`` with
    ``min.insync.replicas=2`` - nothing is acknowledged while the leader is alone, so nothing
    acknowledged is missing from the new leaders (with ``acks=1`` the writes it acknowledged alone
    are gone)."""
    bootstrap, ldir = cluster
    s = settings.with_(kafka_bootstrap_servers=bootstrap, replication_factor=3, min_insync_replicas=2,
                       lease_ttl_ms=60_000, topic_prefix=f"{settings.topic_prefix}cut.")
    ensure_topics(s)
    runs = 24
    entry = PointEntry(f"a leader cut off from its followers, then SIGKILLed, {runs} runs writing", "FAILED")
    t0 = time.monotonic()
    writer = AckLog(s)
    victim, led = _busiest_leader(s)
    others = [n for n in (1, 2, 3) if n != victim]
    window: dict[str, float] = {}
    wf = busy_workflow(calls=30, pause_s=0.02)
    env = {"RUNLOG_CLUSTER_PORT": CLUSTER_PORT}
    try:
        with Runner.from_settings(s, source=source(), writer=writer) as runner:
            handles = [runner.start_run(wf, {"i": i}) for i in range(runs)]

            def execute(i: int) -> bool:
                session = handles[i].session
                assert session is not None
                return runner.execute(session).completed

            with ThreadPoolExecutor(runs, thread_name_prefix="run") as pool:
                futures = [pool.submit(execute, i) for i in range(runs)]
                time.sleep(1.0)
                for n in others:
                    local("cluster", ldir, "pause", str(n), **env)
                window["cut"] = time.monotonic()
                time.sleep(1.5)  # the victim alone receives its partitions' writes
                window["kill"] = time.monotonic()
                local("cluster", ldir, "kill", str(victim), **env)
                for n in others:
                    local("cluster", ldir, "resume", str(n), **env)
                results = [f.result(timeout=300) for f in futures]
    finally:
        for n in others:  # never leave a node stopped, whatever failed
            local("cluster", ldir, "resume", str(n), check=False, **env)
        writer.close()
    local("cluster", ldir, "start", str(victim), **env)  # it truncates to the new leaders' logs
    events = topic_events(s)
    on_topic = Counter((ev.run_id, ev.seq) for ev in events)
    acked = set(writer.acked)
    cut = [k for k, at in writer.produced.items() if window["cut"] <= at <= window["kill"]]
    # records produced while the leader was alone: none may be acknowledged before it dies (with acks=1
    # those of the partitions it leads are, at once). A record produced before the cut may be
    # acknowledged before it and its report run a moment later, inside the window (a CI-like run saw 3
    # of 4,512): that is no ack by a lone leader.
    acked_alone = [k for k, at in writer.acked.items()
                   if window["cut"] <= at <= window["kill"] and writer.produced[k] >= window["cut"]]
    run_ids = {h.run_id for h in handles}
    last_type = {ev.run_id: ev.type for ev in events if ev.run_id in run_ids}
    checks = entry.checks
    checks["written_while_cut_off"] = bool(cut)
    checks["nothing_acked_while_alone"] = not acked_alone
    checks["every_ack_on_topic"] = acked <= set(on_topic)
    checks["no_duplicate_event"] = all(n == 1 for n in on_topic.values())
    checks["no_delivery_error"] = not writer.errors
    checks["every_run_completed"] = all(results) and all(
        last_type.get(r) is EventType.RUN_COMPLETED for r in run_ids)
    entry.run_id = handles[0].run_id
    entry.completed = checks["every_run_completed"]
    entry.lost_events = len(acked - set(on_topic))
    entry.conclude("completed", t0)
    entry.detail.update({"runs": runs, "killed_broker": victim, "partitions_it_led": led,
                         "produced_while_cut_off": len(cut), "acked_while_alone": len(acked_alone),
                         "events": len(events), "acked": len(acked), "lost": entry.lost_events,
                         "delivery_errors": writer.errors[:5]})
    ENTRIES.append(entry)
    assert not entry.failures, (entry.failures, entry.detail)
