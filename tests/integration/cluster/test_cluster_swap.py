"""``runlog projections rebuild --swap`` on a real Redis Cluster (``deploy/local/redis-cluster``).

* a swap catches the rebuild up with events appended after it read its watermarks, keeps the
  writers' keys, drops what the log does not say, and equals a fresh rebuild (``--diff`` exits 0);
  the CLI swaps on a cluster;
* a swap that fails at any slot's moves (connection lost before, reply lost after, a rebuilt key
  gone under it) puts the live and the rebuilt namespace back as they were;
* a swap SIGKILLed midway leaves every slot of the live namespace whole, old or new, and the
  namespace marked ``rebuilding`` (readers ask the log); the projectors' in-place rebuild, or the
  swap run again, makes it equal a fresh rebuild;
* a namespace with a key no slot holds under both prefixes (no hash tag) is refused untouched;
* a swap under a running projector is adopted by it (the standalone test, on the cluster).

Failures are injected by :mod:`tests.integration.cluster._swap_hooks`.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runlog.producers.run._runs import RunKeys
from runlog.projections import RedisStore, diff_namespaces, dump_namespace, rebuild
from runlog.projections._cluster_swap import SlotMoves, slot_moves
from runlog.projections._replicas import online_replicas
from runlog.projections.rebuild import SwapFailed, SwapRefused, replay_into, swap_namespaces
from runlog.projections.recovery import recover
from runlog.schemas import RunEvent, Settings
from runlog.schemas._redis import redis_client
from tests.integration.cluster._swap_hooks import SHA as SWAP_SHA
from tests.integration.cluster._swap_hooks import fail_slot_moves
from tests.integration.processors.harness import ROOT, env_of, produce, wait_until
from tests.integration.projections.test_rebuild_diff_swap import (
    _everything,
    _namespace,
    _restore,
    _snapshot,
    cli,
    shared_key_runs,
    writer_keys,
)
from tests.unit.projections.runlogs import full_run

pytestmark = pytest.mark.integration


def _drop(client: Any, *prefixes: str) -> None:
    for p in prefixes:
        keys = list(client.scan_iter(match=f"{p}:*"))
        if keys:
            client.delete(*keys)


def _names(client: Any, prefix: str) -> list[bytes]:
    return [k.encode() for k in dump_namespace(client, prefix, projection_only=True)]


def _groups(client: Any, live: str, rebuilt: str) -> list[SlotMoves]:
    """The slots a swap of ``rebuilt`` into ``live`` moves, in the order it moves them."""
    return slot_moves(live, rebuilt, f"{rebuilt}:swap-x", _names(client, rebuilt), _names(client, live))


def _halves(runs: list[list[RunEvent]]) -> tuple[list[RunEvent], list[RunEvent]]:
    first = [e for evs in runs for e in evs[: len(evs) // 2]]
    second = [e for evs in runs for e in evs[len(evs) // 2:]]
    return first, second


@pytest.fixture
def cluster_client(settings: Settings) -> Iterator[Any]:
    c = redis_client(settings)
    yield c
    c.close()


def test_a_cluster_swap_catches_up_keeps_writers_keys_and_equals_a_fresh_rebuild(
    topics: Settings, cluster_client: Any
) -> None:
    c, live = cluster_client, topics.redis_prefix
    target, check = f"{live}.rebuild", f"{live}:check"
    runs = [full_run(f"cs-{i}", stages=1 + i % 6) for i in range(16)]
    done, opened, dks = shared_key_runs(3)
    first, second = _halves(runs)
    try:
        produce(topics, first + [e for evs in done for e in evs])
        replay_into(topics, RedisStore(c, live))  # the live projection, as a caught-up projector leaves it
        writer_keys(c, live, [evs[0].run_id for evs in runs], dks)
        # and what no log says: a run the log does not have, a tampered field
        _namespace(c, live, [full_run("stale-run", stages=1)])
        c.hset(f"{live}:{{cs-0}}:state", "stage", "tampered")
        report = rebuild(topics, target, progress=None, client=c)
        produce(topics, second + [e for evs in opened for e in evs])  # after the rebuild read its watermarks
        rebuilt_gen = RedisStore(c, target).marker()
        assert rebuilt_gen is not None and len(_groups(c, live, target)) > 16

        def catch_up(hold: Callable[[], None]) -> None:
            replay_into(topics, RedisStore(c, target), on_batch=hold, from_offsets=report.high_watermarks)

        moved = swap_namespaces(c, live, target, catch_up=catch_up)
        store = RedisStore(c, live)
        assert moved == len(dump_namespace(c, live, projection_only=True))
        marker = store.marker()
        assert marker is not None and (marker.gen, marker.state) == (rebuilt_gen.gen, "ready")
        assert not store.rebuild_locked()
        everyone = runs + done + opened
        states = store.load_states([evs[0].run_id for evs in everyone])
        assert {r: s.last_seq for r, s in states.items()} == {evs[0].run_id: len(evs) for evs in everyone}
        assert sorted(store.runs()) == sorted(evs[0].run_id for evs in everyone)  # stale-run is gone
        after = dump_namespace(c, live)
        assert "{cs-0}:lease" in after and "{cs-0}:epoch" in after and "runs:active" in after
        assert f"{{{dks[0]}}}:effect" in after  # the writers' keys stayed
        for i, dk in enumerate(dks):  # done beats open, in the swapped-in shards too
            e = store.effect(dk)
            assert e is not None and e.run_id == done[i][0].run_id and e.status.value == "DONE"
        assert list(c.scan_iter(match=f"{target}:*")) == []  # moved out; backup and journals deleted

        # equal to a fresh rebuild of the whole log
        out = cli(topics, "--diff", "--target", check, "--quiet")
        assert out.returncode == 0 and "0 keys differ" in out.stdout, out.stdout + out.stderr
        # and the CLI swaps on a cluster: exit 0, a new generation, still equal
        out = cli(topics, "--swap", "--quiet")
        assert out.returncode == 0 and "swapped" in out.stdout, out.stdout + out.stderr
        again = store.marker()
        assert again is not None and again.gen != rebuilt_gen.gen and again.state == "ready"
        assert diff_namespaces(c, live, check) == []
        assert "{cs-0}:lease" in dump_namespace(c, live)
    finally:
        _drop(c, target, check)


@pytest.fixture
def two(settings: Settings, cluster_client: Any) -> Iterator[tuple[str, str]]:
    """A live namespace (with writers' keys) and a different rebuilt one, on the cluster."""
    live, rebuilt = f"{settings.redis_prefix}:live", f"{settings.redis_prefix}:rebuilt"
    _namespace(cluster_client, live, [full_run("r1", stages=2), full_run("r2", stages=3),
                                      full_run("stale", stages=1), full_run("r5", stages=2)])
    _namespace(cluster_client, rebuilt, [full_run("r1", stages=4), full_run("r2", stages=3),
                                         full_run("r3", stages=6), full_run("r4", stages=1),
                                         full_run("r5", stages=2)])
    writer_keys(cluster_client, live, ["r1", "r2"], ["c" * 64])
    yield live, rebuilt
    _drop(cluster_client, live, rebuilt)


@pytest.mark.parametrize("chunk", [1, 3])
@pytest.mark.parametrize("mode", ["before", "after", "vanished"])
def test_a_cluster_swap_that_fails_at_any_slot_restores_both_namespaces(
    mode: str, chunk: int, settings: Settings, cluster_client: Any, two: tuple[str, str]
) -> None:
    """Every pipeline of slot moves, one failure at a time (``chunk`` slots a pipeline: with 3, the
    other slots of a failed pipeline were moved, or, with ``vanished``, the slots before the refused
    one)."""
    c = cluster_client
    live, rebuilt = two
    live_before, rebuilt_before = _everything(c, live), _everything(c, rebuilt)
    rebuilt_snap = _snapshot(c, rebuilt)
    new = dump_namespace(c, rebuilt, projection_only=True)
    groups = _groups(c, live, rebuilt)
    assert len(groups) >= 6
    for n in range(1, -(-len(groups) // chunk) + 1):
        last = groups[min(n * chunk, len(groups)) - 1]  # the slot ``vanished`` takes a key from
        if mode == "vanished" and not any(incoming for _, incoming in last.names):
            continue  # a slot that only moves out has no rebuilt key to lose
        failing = redis_client(settings)
        try:
            hooks = fail_slot_moves(failing, n, mode)
            with pytest.raises(SwapFailed) as info:
                swap_namespaces(failing, live, rebuilt, chunk=chunk)
        finally:
            failing.close()
        assert hooks.forward == n
        assert info.value.restored and "restored as it was" in str(info.value), info.value
        assert _everything(c, live) == live_before, (mode, n)
        now = _everything(c, rebuilt)
        if mode == "vanished":  # only the key deleted under the swap is missing from the rebuild
            assert hooks.vanished is not None
            gone = hooks.vanished[len(rebuilt) + 1:]
            assert now == {k: v for k, v in rebuilt_before.items() if k != gone}, (n, gone)
            _restore(c, rebuilt, rebuilt_snap)
            now = _everything(c, rebuilt)
        assert now == rebuilt_before, (mode, n)
        assert not list(c.scan_iter(match=f"{rebuilt}:swap-*"))  # no backup, no journal left behind

    # and without a failure the swap goes through
    assert swap_namespaces(c, live, rebuilt, chunk=2) == len(new)
    assert dump_namespace(c, live, projection_only=True) == new
    after = dump_namespace(c, live)
    assert "{r1}:lease" in after and "{r1}:epoch" in after and "runs:active" in after
    assert f"{{{'c' * 64}}}:effect" in after and "{stale}:state" not in after
    assert dump_namespace(c, rebuilt) == {}
    assert c.hgetall(f"{live}:projection")[b"state"] == b"ready"
    assert not c.exists(f"{live}:projection:rebuild")


def test_a_cluster_swap_refuses_a_key_without_hash_tag(cluster_client: Any, two: tuple[str, str]) -> None:
    c = cluster_client
    live, rebuilt = two
    c.zadd(f"{live}:runs:by_status:RUNNING", {"r1": 1})  # the unsharded layout: not one slot's
    before = (_everything(c, live), _everything(c, rebuilt))
    with pytest.raises(SwapRefused, match="no hash tag"):
        swap_namespaces(c, live, rebuilt)
    assert (_everything(c, live), _everything(c, rebuilt)) == before


@pytest.mark.parametrize(("recovery", "cut"), [("projectors", "runs"), ("projectors", "shards"),
                                             ("swap-again", "runs")])
def test_a_cluster_swap_killed_midway_leaves_whole_slots_and_is_recovered(
    recovery: str, cut: str, topics: Settings, cluster_client: Any
) -> None:
    """Killed among the runs' slots (every index shard swapped in, some runs not) or among the
    shards' (no run swapped in yet)."""
    c, live = cluster_client, topics.redis_prefix
    target, check = f"{live}.rebuild", f"{live}:check"
    runs = [full_run(f"ck-{i}", stages=2 + i % 5) for i in range(12)]
    first, second = _halves(runs)
    try:
        produce(topics, first)
        replay_into(topics, RedisStore(c, live))  # a live projection half way through the log
        writer_keys(c, live, [evs[0].run_id for evs in runs], [])
        produce(topics, second)
        rebuild(topics, target, progress=None, client=c)
        old = dump_namespace(c, live, projection_only=True)
        new = dump_namespace(c, target, projection_only=True)
        groups = _groups(c, live, target)
        shards = [g.holds_shard for g in groups]
        assert shards == sorted(shards, reverse=True)  # the index shards' slots move first
        k = sum(shards) + (len(groups) - sum(shards)) // 2 if cut == "runs" else sum(shards) // 2
        assert 0 < k < len(groups)
        proc = subprocess.run([sys.executable, "-m", "tests.integration.cluster._swap_hooks",
                               topics.redis_url, live, target, str(k), "3000"], cwd=ROOT, env=env_of(topics),
                              capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr

        # every slot whole: the first k swapped in, the others as they were; the marker says so
        after = dump_namespace(c, live, projection_only=True)
        differ = []
        for i, g in enumerate(groups):
            names = [n.decode() for n, _ in g.names]
            was, will = ({x: d[x] for x in names if x in d} for d in (old, new))
            assert {x: after[x] for x in names if x in after} == (will if i < k else was), (i, names)
            differ.append(was != will)
        assert any(differ[:k]) and any(differ[k:])  # the check told old from new on both sides of the cut
        store = RedisStore(c, live)
        marker = store.marker()
        assert marker is not None and marker.state == "rebuilding"
        # a reader of the marker does not take a run missing from it for a run that does not exist
        assert RunKeys(c, live).known("ck-0") is True and RunKeys(c, live).known("no-such-run") is None
        assert "{ck-0}:lease" in dump_namespace(c, live)

        assert wait_until(lambda: not store.rebuild_locked(), 30, every=0.2)  # the crashed swap's lock
        if recovery == "projectors":  # what a projector refused as lost does: rebuild in place
            assert recover(topics, store, timeout_s=60) is not None
        else:
            out = cli(topics, "--swap", "--quiet")
            assert out.returncode == 0 and "swapped" in out.stdout, out.stdout + out.stderr
            assert list(c.scan_iter(match=f"{target}:*")) == []  # the crashed swap's backup too
        marker = store.marker()
        assert marker is not None and marker.state == "ready"
        assert RunKeys(c, live).known("no-such-run") is False
        out = cli(topics, "--diff", "--target", check, "--quiet")
        assert out.returncode == 0 and "0 keys differ" in out.stdout, out.stdout + out.stderr
    finally:
        _drop(c, target, check)


def test_a_cluster_swap_under_a_running_projector_is_adopted_and_the_projection_goes_on(
    topics: Settings, cluster_client: Any, tmp_path: Path
) -> None:
    """The standalone test, on the cluster: the CLI swaps while a projector runs; the projector's
    applies are refused while the namespace is fenced, it adopts the swapped-in generation and goes
    on, and the result equals a fresh rebuild."""
    from tests.integration.projections.test_rebuild_diff_swap import (
        test_a_swap_under_a_running_projector_is_adopted_and_the_projection_goes_on as standalone_case,
    )

    assert topics.redis_url.startswith("redis+cluster://")
    standalone_case(topics, cluster_client, tmp_path)


def test_a_cluster_swap_waits_for_replicas_on_every_pipeline_of_slot_moves(
    settings: Settings, cluster_client: Any, two: tuple[str, str]
) -> None:
    """Each pipeline of slot moves ends with a ``WAIT`` per primary it moved keys on (the live
    store's replica waits, :mod:`runlog.projections._replicas`), so a failover cannot undo an
    acknowledged move."""
    live, rebuilt = two
    seen: list[list[tuple[Any, ...]]] = []
    real = cluster_client.pipeline

    class Recording:
        def __init__(self, pipe: Any) -> None:
            self._pipe, self.calls = pipe, []

        def execute_command(self, *args: Any, **kw: Any) -> Any:
            self.calls.append(args)
            return self._pipe.execute_command(*args, **kw)

        def execute(self, raise_on_error: bool = True) -> Any:
            seen.append(self.calls)
            return self._pipe.execute(raise_on_error=raise_on_error)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._pipe, name)

    cluster_client.pipeline = lambda transaction=None, shard_hint=None: Recording(
        real(transaction=transaction, shard_hint=shard_hint))
    primaries = cluster_client.get_primaries()
    assert wait_until(lambda: all(online_replicas(cluster_client.get_redis_connection(n).info("replication"))
                                  for n in primaries), 60, every=0.5), "the primaries have no online replica"
    swap_namespaces(cluster_client, live, rebuilt, chunk=3)
    moves = [calls for calls in seen if any(c[0] == "EVALSHA" and c[1] == SWAP_SHA for c in calls)]
    assert moves
    for calls in moves:
        waits = [c for c in calls if c[0] == "WAIT"]
        assert waits and calls[-len(waits):] == waits, calls  # after the moves, one per primary
