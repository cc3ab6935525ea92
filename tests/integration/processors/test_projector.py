"""The projector against the real broker and Redis: crash, garbage, zombies, scale-out, rebuild."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import redis

from runlog.processors.dlq import H_OFFSET, H_PARTITION, H_REASON, H_TOPIC, parse_headers
from runlog.projections import RedisStore, RunStatus, diff_namespaces, dump_namespace, read_run_tail
from runlog.schemas import Codec, Settings, Topics
from tests.unit.projections.runlogs import RunBuilder, full_run, zombie

from .harness import (
    ROOT,
    converges,
    env_of,
    garbage,
    interleave,
    produce,
    read_topic,
    reference,
    start_projector,
    stop,
    wait_until,
)

pytestmark = pytest.mark.integration


def many_runs(n: int, per_run: int) -> list[list]:
    """n runs of about ``per_run`` events each, some ending mid-stage (crashed writers)."""
    runs = []
    for i in range(n):
        stages, calls = 1 + i % 6, 1
        while len(events := full_run(f"run-{i:04d}", stages=stages, calls=calls)) < per_run:
            calls += 1
        runs.append(events)
    return runs


@pytest.mark.slow
def test_sigkill_mid_stream_then_restart_equals_full_rebuild(
    topics: Settings, redis_client: redis.Redis, tmp_path: Path
) -> None:
    runs = many_runs(500, 40)
    stream = interleave(runs)
    assert len(stream) >= 20_000
    produce(topics, stream[: len(stream) // 2])
    proc = start_projector(topics, f"{topics.topic_prefix}proj", log=tmp_path / "p1.log")
    store = RedisStore(redis_client, topics.redis_prefix)
    try:
        produce(topics, stream[len(stream) // 2:])
        assert wait_until(lambda: len(store.runs()) >= 100, 90, every=0.2), "projector made no progress"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        mid = len(store.runs())
        assert mid > 0, "nothing projected before the kill"
        proc = start_projector(topics, f"{topics.topic_prefix}proj", log=tmp_path / "p2.log")
        ref = reference(topics, redis_client)
        assert converges(topics, redis_client, ref, timeout=150) == []
    finally:
        stop(proc)
    dump = dump_namespace(redis_client, topics.redis_prefix)
    assert len([k for k in dump if k.endswith(":state")]) == 500
    done = store.runs(RunStatus.COMPLETED)
    assert len(done) == sum(1 for r in runs if r[-1].type.value == "RUN_COMPLETED")


def test_garbage_goes_to_dlq_zombies_are_rejected_and_flush_rebuild_restores(
    topics: Settings, redis_client: redis.Redis, tmp_path: Path
) -> None:
    runs = many_runs(40, 30)
    b = RunBuilder("zombie-run").start().stage("research").lease(2).stage("verify")
    old_writer = [zombie(b.events[3], epoch=1, seq=s) for s in (b.seq + 1, b.seq + 2, 5)]
    junk = garbage(1000)
    stream = interleave([*runs, b.events])
    mixed: list = []
    for i, ev in enumerate(stream):
        mixed.append(ev)
        if i < len(junk):
            mixed.append(junk[i])
    mixed.extend(junk[len(stream):])
    mixed.extend(old_writer)
    produce(topics, mixed)
    proc = start_projector(topics, f"{topics.topic_prefix}proj", log=tmp_path / "p.log")
    try:
        ref = reference(topics, redis_client)
        assert converges(topics, redis_client, ref, timeout=120) == []
        assert proc.poll() is None, "the projector stopped"
    finally:
        stop(proc)
    store = RedisStore(redis_client, topics.redis_prefix)
    z = store.load_state("zombie-run")
    assert z is not None and z.last_seq == b.seq and z.epoch == 2
    assert z.rejected == {"stale_epoch": 3} and [r.epoch for r in z.recent_rejected] == [1, 1, 1]
    for r in runs:
        s = store.load_state(r[0].run_id)
        assert s is not None and s.last_seq == len(r) and s.rejected_total == 0
    dead = read_topic(topics, Topics.of(topics).dlq)
    assert len(dead) >= 1000
    by_offset = {}
    for m in dead:
        h = parse_headers(m.headers())  # type: ignore[attr-defined]
        assert h[H_TOPIC] == Topics.of(topics).events and h[H_REASON]
        by_offset[(int(h[H_PARTITION]), int(h[H_OFFSET]))] = (h[H_REASON], m.key(), m.value())  # type: ignore[attr-defined]
    assert len(by_offset) == 1000
    reasons = {r for r, _, _ in by_offset.values()}
    assert reasons == {"unknown_framing", "unknown_schema", "truncated"}
    sent = {k: v for k, v in junk}
    assert all(sent[k] == v for _, k, v in by_offset.values())
    cps = read_topic(topics, Topics.of(topics).checkpoints)
    assert {m.key().decode() for m in cps} == {r[0].run_id for r in runs} | {"zombie-run"}  # type: ignore[attr-defined]
    # flush everything, then `runlog projections rebuild --swap` restores the same state
    before = dump_namespace(redis_client, topics.redis_prefix)
    redis_client.delete(*[f"{topics.redis_prefix}:{k}" for k in before])
    assert dump_namespace(redis_client, topics.redis_prefix) == {}
    out = subprocess.run(
        [sys.executable, "-m", "runlog", "projections", "rebuild", "--swap", "--diff"],
        cwd=ROOT, env=env_of(topics), capture_output=True, text=True, timeout=120, check=False,
    )
    assert out.returncode == 1, out.stderr  # the live namespace was empty: everything differed
    assert dump_namespace(redis_client, topics.redis_prefix) == before
    again = subprocess.run(
        [sys.executable, "-m", "runlog", "projections", "rebuild", "--diff"],
        cwd=ROOT, env=env_of(topics), capture_output=True, text=True, timeout=120, check=False,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "rebuild:" in again.stderr and "0 keys differ" in again.stdout


def test_two_instances_split_partitions_and_equal_one(
    topics: Settings, redis_client: redis.Redis, tmp_path: Path
) -> None:
    runs = many_runs(120, 30)
    port = 19_000 + int(time.time()) % 500
    a = start_projector(topics, f"{topics.topic_prefix}grp", log=tmp_path / "a.log",
                        RUNLOG_METRICS_PORT=str(port))
    b = start_projector(topics, f"{topics.topic_prefix}grp", log=tmp_path / "b.log",
                        RUNLOG_METRICS_PORT=str(port + 1))
    def scrape() -> list[str]:
        return [urllib.request.urlopen(f"http://127.0.0.1:{p}/metrics", timeout=5).read().decode()
                for p in (port, port + 1)]

    def lag_partitions(text: str) -> set[str]:
        return {line.split('"')[1] for line in text.splitlines()
                if line.startswith("runlog_projector_consumer_lag{")}

    def split() -> bool:
        try:
            pa, pb = (lag_partitions(t) for t in scrape())
        except OSError:  # not listening yet
            return False
        return bool(pa and pb and not pa & pb and len(pa | pb) == topics.partitions)

    try:
        assert wait_until(split, 60), "the two instances did not split the partitions"
        produce(topics, interleave(runs))
        ref = reference(topics, redis_client)
        assert converges(topics, redis_client, ref, timeout=120) == []
        texts = scrape()
    finally:
        stop(a)
        stop(b)

    pa, pb = lag_partitions(texts[0]), lag_partitions(texts[1])
    assert pa and pb and not pa & pb, (pa, pb)
    applied = [float(next(line.split()[1] for line in t.splitlines()
                          if line.startswith("runlog_projector_events_applied_total"))) for t in texts]
    assert sum(applied) >= sum(len(r) for r in runs) and all(x > 0 for x in applied)


def test_read_run_tail_folds_only_that_run_from_a_checkpoint(
    topics: Settings, redis_client: redis.Redis
) -> None:
    runs = many_runs(30, 30)
    produce(topics, interleave(runs))
    ref = reference(topics, redis_client)
    store = RedisStore(redis_client, ref)
    target = runs[5]
    rid = target[0].run_id
    full = store.load_state(rid)
    cps = store.checkpoints(rid)
    assert full is not None and len(cps) >= 2
    cp = cps[0]
    state, n = read_run_tail(topics, rid, cp.checkpoint.partition, cp.checkpoint.offset, cp.state,
                             codec=Codec())
    assert state == full
    assert n == len(target) - cp.checkpoint.last_seq + 1  # the VERIFIED record itself is re-read
    whole, n_all = read_run_tail(topics, rid, full.partition, 0, None)
    assert whole == full and n_all == len(target)
    assert diff_namespaces(redis_client, ref, ref) == []


def test_a_projector_started_on_an_emptied_namespace_rebuilds_it_before_consuming(
    topics: Settings, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """Redis lost while no projector ran: the group's committed offsets are past everything, so
    consuming on would leave Redis empty. The projector sees no namespace marker with committed
    offsets (``lost_at_start``) and rebuilds from the log first."""
    from runlog.projections.recovery import lost_at_start

    runs = many_runs(10, 20)
    produce(topics, interleave(runs))
    app_id = f"{topics.topic_prefix}proj"
    store = RedisStore(redis_client, topics.redis_prefix)
    assert not lost_at_start(topics, store, app_id)  # no marker, but no committed offsets either
    proc = start_projector(topics, app_id, log=tmp_path / "p1.log")
    try:
        ref = reference(topics, redis_client)
        assert converges(topics, redis_client, ref, timeout=120) == []
        # offsets are committed about every second
        time.sleep(3)
    finally:
        stop(proc)
    keys = list(redis_client.scan_iter(match=f"{topics.redis_prefix}:*"))
    redis_client.delete(*keys)
    assert lost_at_start(topics, store, app_id)
    proc = start_projector(topics, app_id, log=tmp_path / "p2.log")
    try:
        assert converges(topics, redis_client, ref, timeout=120) == []
    finally:
        stop(proc)
    assert "rebuilding it from the log" in (tmp_path / "p2.log").read_text()
    marker = store.marker()
    assert marker is not None and marker.state == "ready"
    assert not lost_at_start(topics, store, app_id)


def test_a_new_group_on_a_topic_with_history_reads_as_not_ready_until_it_has_caught_up(
    topics: Settings, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """Issue 24, item 5: a projector with a new group on an existing topic marked the namespace ready at
    its first write, while it was still replaying; a keyed retry in that window took a run missing from
    Redis for an unknown one instead of asking the log."""
    from runlog.producers.run._runs import RunKeys
    from runlog.projections._marker import READY, REPLAYING

    runs = many_runs(300, 40)
    produce(topics, interleave(runs))
    store = RedisStore(redis_client, topics.redis_prefix)
    keys = RunKeys(redis_client, topics.redis_prefix)
    assert store.marker() is None
    proc = start_projector(topics, f"{topics.topic_prefix}fresh", log=tmp_path / "p.log")
    seen: list[tuple[str, bool | None, int]] = []
    try:
        def ready() -> bool:
            m = store.marker()
            if m is None:
                return False
            states = sum(1 for _ in redis_client.scan_iter(match=f"{topics.redis_prefix}:{{*}}:state",
                                                           count=1000)) if m.state == READY else -1
            known = keys.known("no-such-run")
            after = store.marker()
            # the marker may turn ready between the two reads; a sample counts as replaying only when
            # it was replaying after ``known`` answered too (the marker never goes back)
            state = READY if m.state == READY or (after is not None and after.state == READY) else m.state
            seen.append((state, known, states))
            return m.state == READY

        assert wait_until(ready, 180, every=0.05), f"never ready: {seen[-3:]}"
    finally:
        stop(proc)
    assert seen[0][0] == REPLAYING, seen[:3]
    # while replaying, a run Redis does not hold is not known to be absent (ask the log)
    assert all(known is None for state, known, _ in seen if state == REPLAYING)
    # ready only once every run is projected, and then a missing run is known absent
    assert seen[-1] == (READY, False, 300)
    ref = reference(topics, redis_client)
    assert diff_namespaces(redis_client, topics.redis_prefix, ref) == []


def test_the_projector_says_when_it_is_consuming_and_stops_cleanly_on_sigterm(
    topics: Settings, tmp_path: Path
) -> None:
    log = tmp_path / "p.log"
    proc = start_projector(topics, f"{topics.topic_prefix}said", log=log)
    try:
        assert wait_until(lambda: "assigned 12 partition(s)" in log.read_text(), 60, every=0.2), \
            log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0  # a supervisor sees a clean stop
    finally:
        stop(proc)
    text = log.read_text()
    assert text.startswith(f"runlog project: starting: group {topics.topic_prefix}")
    assert "\x1b[" not in text  # no terminal escapes in a log file
