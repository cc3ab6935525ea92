"""``runlog projections rebuild --diff`` and ``--swap`` against a real broker, Redis and projector.

* a live projector that caught up equals a rebuild of the log: ``--diff`` exits 0, although the live
  namespace also holds writers' keys and runs share a delivery key (one open, one done);
* ``--swap`` refuses overlapping prefixes, and a swap that fails midway leaves the live namespace as
  it was; a swap catches up with events the projectors applied after the rebuild.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis

from runlog.projections import RedisStore, diff_namespaces, dump_namespace, rebuild
from runlog.projections.rebuild import (
    NamespaceOverlap,
    SwapFailed,
    SwapRefused,
    is_projection_key,
    prefixes_overlap,
    replay_into,
    swap_namespaces,
)
from runlog.schemas import EventType, ReplayPolicy, RunEvent, Settings
from tests.integration.processors.harness import ROOT, env_of, produce, start_projector, stop, wait_until
from tests.unit.projections.runlogs import T0, RunBuilder, full_run
from tests.unit.projections.store_contract import fold_updates

pytestmark = pytest.mark.integration


def shared_key_runs(pairs: int) -> tuple[list[list[RunEvent]], list[list[RunEvent]], list[str]]:
    """``pairs`` delivery keys, each delivered by a run that finished it (appended first) and by a
    run that opened it later and crashed with the intent open (appended second)."""
    done, opened, keys = [], [], []
    for i in range(pairs):
        dk = uuid.uuid4().hex * 2
        keys.append(dk)
        for kind, finish in (("done", True), ("open", False)):
            b = RunBuilder(f"{kind}-{i}-{dk[:6]}").start()
            b.add(EventType.STAGE_STARTED, stage="publish")
            b.add(EventType.EFFECT_INTENT, stage="publish", call_id="publish/cms/0", tool="cms",
                  delivery_key=dk, target="cms:articles", replay_policy=ReplayPolicy.RECONCILE_FIRST)
            if finish:
                b.add(EventType.EFFECT_RESULT, stage="publish", call_id="publish/cms/0",
                      delivery_key=dk, external_id=f"article-{i}")
                b.complete()
                done.append(b.events)
            else:  # opened later, in event time too
                opened.append([replace(e, occurred_at=e.occurred_at + 1_000) for e in b.events])
    return done, opened, keys


def writer_keys(client: redis.Redis, prefix: str, run_ids: list[str], dks: list[str]) -> None:
    """Keys the Runner writes in the live namespace, which a rebuild never has."""
    for r in run_ids:
        client.set(f"{prefix}:{{{r}}}:epoch", 3)
        client.set(f"{prefix}:{{{r}}}:lease", "holder-x", px=600_000)
        client.zadd(f"{prefix}:runs:active", {r: T0})
    for dk in dks:
        client.hset(f"{prefix}:{{{dk}}}:effect", mapping={"run_id": "someone", "epoch": 1})
    client.set(f"{prefix}:runs:by_idempotency_key:{'ab' * 32}", json.dumps({"run_id": run_ids[0]}))


def cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runlog", "projections", "rebuild", *args],
                          cwd=ROOT, env=env_of(settings), capture_output=True, text=True, timeout=180,
                          check=False)


def caught_up(store: RedisStore, runs: list[list[RunEvent]]) -> Callable[[], bool]:
    want = {evs[0].run_id: len(evs) for evs in runs}

    def check() -> bool:
        states = store.load_states(want)
        return all(r in states and states[r].last_seq == n for r, n in want.items())

    return check


def test_a_caught_up_projector_equals_a_rebuild_and_diff_exits_0(
    topics: Settings, redis_client: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    live = topics.redis_prefix
    store = RedisStore(redis_client, live)
    plain = [full_run(f"run-{i}", stages=1 + i % 6) for i in range(12)]
    done, opened, dks = shared_key_runs(8)
    # small batches and a tiny run cache: other batch boundaries than the rebuild's, and run states
    # reloaded from their JSON snapshot
    proc = start_projector(topics, f"{topics.topic_prefix}proj", "--batch-size", "7", "--cache-size", "3",
                           log=tmp_path / "projector.log")
    try:
        produce(topics, [e for evs in plain + done for e in evs])
        assert wait_until(caught_up(store, plain + done), 120, every=0.5), \
            (tmp_path / "projector.log").read_text()[-3000:]
        produce(topics, [e for evs in opened for e in evs])  # the later runs come later
        everything = plain + done + opened
        assert wait_until(caught_up(store, everything), 120, every=0.5), \
            (tmp_path / "projector.log").read_text()[-3000:]
    finally:
        stop(proc)
    writer_keys(redis_client, live, [evs[0].run_id for evs in everything], dks)
    for i, dk in enumerate(dks):  # done beats open, live
        e = store.effect(dk)
        assert e is not None and e.run_id == done[i][0].run_id and e.status.value == "DONE"

    # a rebuild inside the live prefix (what an ACL `~tenant:*` forces) compares equal
    nested = f"{live}:rebuild"
    rebuild(topics, nested, progress=None, client=redis_client)
    assert diff_namespaces(redis_client, live, nested) == []
    # fetched 3 records at a time and folded in chunks of at least 5 (several fetches a chunk, a run
    # written at many chunk boundaries, not once): equal too
    monkeypatch.setattr(importlib.import_module("runlog.projections.rebuild"), "REPLAY_CHUNK", 5)
    monkeypatch.setattr(importlib.import_module("runlog.projections.log_reader"), "BATCH", 3)
    rebuild(topics, f"{live}:chunked", progress=None, client=redis_client)
    assert diff_namespaces(redis_client, live, f"{live}:chunked") == []
    every = dump_namespace(redis_client, live)
    assert f"{{{everything[0][0].run_id}}}:lease" in every and "runs:active" in every  # not compared
    out = cli(topics, "--diff", "--target", f"{live}:cli")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 keys differ" in out.stdout
    out = cli(topics, "--diff", "--json", "--quiet")  # the default target, <live>:rebuild (nested)
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        assert json.loads(out.stdout)["differing_keys"] == []
    finally:
        keys = list(redis_client.scan_iter(match=f"{live}.rebuild:*"))
        if keys:
            redis_client.delete(*keys)

    # a difference in any field of a projection key is seen
    k = f"{live}:{{{plain[0][0].run_id}}}:state"
    redis_client.hset(k, "stage", "tampered")
    assert diff_namespaces(redis_client, live, nested) == [f"{{{plain[0][0].run_id}}}:state"]
    out = cli(topics, "--diff", "--target", f"{live}:cli")
    assert out.returncode == 1 and f"differs {{{plain[0][0].run_id}}}:state" in out.stdout


def test_projection_key_shapes_and_overlap() -> None:
    for name in ("{r1}:state", "{r1}:checkpoints", "{r1}:effects", "runs:by_status:RUNNING",
                 "runs:by_status:COMPLETED", "effects:by_key"):
        assert is_projection_key(name.encode()), name
    for name in ("{r1}:lease", "{r1}:epoch", "runs:by_idempotency_key:ab", "runs:active", "projection",
                 "projection:rebuild", "{dk}:effect", "rebuild:{r1}:state", "rebuild:effects:by_key",
                 "rb:runs:by_status:RUNNING", "{x}:{r1}:state", "runs:by_status:", "effects:by_key:x"):
        assert not is_projection_key(name.encode()), name
    assert prefixes_overlap("t", "t") and prefixes_overlap("t", "t:rebuild") and prefixes_overlap("t:r", "t")
    assert not prefixes_overlap("runlog", "runlog.rebuild") and not prefixes_overlap("t:live", "t:rebuild")
    assert not prefixes_overlap("tenant", "tenant2")


def _namespace(client: redis.Redis, prefix: str, runs: list[list[RunEvent]]) -> RedisStore:
    store = RedisStore(client, prefix)
    for evs in runs:
        store.apply(fold_updates(evs))
    return store


@pytest.fixture
def two(settings: Settings, redis_client: redis.Redis) -> tuple[str, str]:
    """A live namespace (with writers' keys) and a different rebuilt one, sibling prefixes."""
    live, rebuilt = f"{settings.redis_prefix}:live", f"{settings.redis_prefix}:rebuilt"
    _namespace(redis_client, live, [full_run("r1", stages=2), full_run("r2", stages=3),
                                    full_run("stale", stages=1)])
    _namespace(redis_client, rebuilt, [full_run("r1", stages=4), full_run("r2", stages=3),
                                       full_run("r3", stages=6)])
    writer_keys(redis_client, live, ["r1", "r2"], ["c" * 64])
    return live, rebuilt


def _everything(client: redis.Redis, prefix: str) -> dict[str, Any]:
    return {**dump_namespace(client, prefix),
            "<marker>": client.hgetall(f"{prefix}:projection"),
            "<lock>": client.get(f"{prefix}:projection:rebuild")}


def test_swap_refuses_overlapping_prefixes_and_changes_nothing(
    settings: Settings, redis_client: redis.Redis, two: tuple[str, str]
) -> None:
    live, rebuilt = two
    before = _everything(redis_client, live)
    for a, b in ((live, f"{live}:rebuild"), (f"{live}:x", live), (live, live)):
        with pytest.raises(NamespaceOverlap, match="overlaps the live prefix"):
            swap_namespaces(redis_client, a, b)
    with pytest.raises(NamespaceOverlap):
        rebuild(settings.with_(redis_prefix=live), settings.redis_prefix, progress=None, client=redis_client)
    assert _everything(redis_client, live) == before
    # the CLI: exit 2 before rebuilding anything
    out = cli(settings.with_(redis_prefix=live), "--swap", "--target", f"{live}:rebuild")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "overlaps the live prefix" in out.stderr and out.stdout == ""
    assert _everything(redis_client, live) == before
    # a rebuilt namespace that is not a finished rebuild, a live one being rebuilt: refused
    redis_client.hset(f"{rebuilt}:projection", "state", "rebuilding")
    with pytest.raises(SwapRefused, match="not a finished rebuild"):
        swap_namespaces(redis_client, live, rebuilt)
    redis_client.hset(f"{rebuilt}:projection", "state", "ready")
    redis_client.set(f"{live}:projection:rebuild", "a-projector")
    with pytest.raises(SwapRefused, match="being rebuilt"):
        swap_namespaces(redis_client, live, rebuilt)
    redis_client.delete(f"{live}:projection:rebuild")
    assert _everything(redis_client, live) == before


class _Crash(redis.ConnectionError):
    pass


class FailingClient:
    """A Redis client whose ``n``-th transaction (MULTI/EXEC) fails: before it runs (``before``),
    after it ran with its reply lost (``after``), or with the source of one of its renames deleted
    just before (``vanished``: Redis itself refuses that rename inside the EXEC, the others run).
    Every other call goes to the real client."""

    def __init__(self, client: redis.Redis, n: int, mode: str, vanish_prefix: str = "") -> None:
        self._client, self._n, self._mode, self._vanish = client, n, mode, vanish_prefix.encode()
        self.execs = 0
        self.vanished: bytes | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def pipeline(self, transaction: bool = True) -> Any:
        pipe = self._client.pipeline(transaction=transaction)
        if not transaction:
            return pipe
        outer = self
        real = pipe.execute

        def execute(raise_on_error: bool = True) -> Any:
            outer.execs += 1
            if outer.execs != outer._n:
                return real(raise_on_error=raise_on_error)
            if outer._mode == "before":
                pipe.reset()
                raise redis.ConnectionError("connection lost before EXEC")
            if outer._mode == "vanished":
                sources = [bytes(c[0][1]) for c in pipe.command_stack
                           if c[0][0] == "RENAME" and bytes(c[0][1]).startswith(outer._vanish)]
                outer.vanished = sources[-1]
                outer._client.delete(outer.vanished)
                return real(raise_on_error=raise_on_error)
            real(raise_on_error=raise_on_error)
            raise redis.ConnectionError("connection lost after EXEC")

        pipe.execute = execute
        return pipe


def _snapshot(client: redis.Redis, prefix: str) -> dict[bytes, bytes]:
    return {k: client.dump(k) for k in client.scan_iter(match=f"{prefix}:*")}  # type: ignore[misc]


def _restore(client: redis.Redis, prefix: str, snap: dict[bytes, bytes]) -> None:
    for k in client.scan_iter(match=f"{prefix}:*"):
        client.delete(k)
    for k, v in snap.items():
        client.restore(k, 0, v)


@pytest.mark.parametrize("mode", ["before", "after", "vanished"])
def test_a_swap_that_fails_midway_leaves_the_live_namespace_whole(
    mode: str, redis_client: redis.Redis, two: tuple[str, str]
) -> None:
    live, rebuilt = two
    live_before, rebuilt_before = _everything(redis_client, live), _everything(redis_client, rebuilt)
    rebuilt_snap = _snapshot(redis_client, rebuilt)
    new = dump_namespace(redis_client, rebuilt, projection_only=True)
    stale = set(dump_namespace(redis_client, live, projection_only=True)) - set(new)
    chunk = 2
    phase1, phase2 = -(-len(new) // chunk), -(-len(stale) // chunk)
    assert phase1 >= 3 and phase2 >= 1
    # every move transaction, one failure at a time (a vanishing key only where rebuilt keys move)
    for n in range(1, phase1 + (0 if mode == "vanished" else phase2) + 1):
        failing = FailingClient(redis_client, n, mode, vanish_prefix=f"{rebuilt}:")
        with pytest.raises(SwapFailed) as info:
            swap_namespaces(failing, live, rebuilt, chunk=chunk)  # type: ignore[arg-type]
        assert info.value.restored and "restored as it was" in str(info.value), info.value
        assert _everything(redis_client, live) == live_before, (mode, n)
        now = _everything(redis_client, rebuilt)
        if mode == "vanished":  # only the key deleted under the swap is missing from the rebuild
            assert failing.vanished is not None
            gone = failing.vanished.decode()[len(rebuilt) + 1:]
            assert now == {k: v for k, v in rebuilt_before.items() if k != gone}, (n, gone)
            _restore(redis_client, rebuilt, rebuilt_snap)
            now = _everything(redis_client, rebuilt)
        assert now == rebuilt_before, (mode, n)
        assert not list(redis_client.scan_iter(match=f"{rebuilt}:swap-*"))  # no backup left behind

    # and without a failure the swap goes through
    assert swap_namespaces(redis_client, live, rebuilt, chunk=chunk) == len(new)
    assert dump_namespace(redis_client, live, projection_only=True) == new
    after = dump_namespace(redis_client, live)
    assert "{r1}:lease" in after and "{r1}:epoch" in after and "runs:active" in after  # writers' keys stay
    assert f"{{{'c' * 64}}}:effect" in after and "{stale}:state" not in after
    assert dump_namespace(redis_client, rebuilt) == {}  # moved out, the backup deleted
    assert redis_client.hgetall(f"{live}:projection")[b"state"] == b"ready"
    assert not redis_client.exists(f"{live}:projection:rebuild")
    st = RedisStore(redis_client, live).load_state("r3")
    assert st is not None and st.status.value == "COMPLETED"


def test_swap_catches_up_with_events_appended_after_the_rebuild(
    topics: Settings, redis_client: redis.Redis
) -> None:
    live = topics.redis_prefix
    target = f"{live}.swap-target"
    first = full_run("late", stages=6)
    cut = len(first) // 2
    produce(topics, first[:cut])
    try:
        report = rebuild(topics, target, progress=None, client=redis_client)
        produce(topics, first[cut:])  # a live projector would have applied these meanwhile

        def catch_up(hold: Callable[[], None]) -> None:
            replay_into(topics, RedisStore(redis_client, target), on_batch=hold,
                        from_offsets=report.high_watermarks)

        swap_namespaces(redis_client, live, target, catch_up=catch_up)
        st = RedisStore(redis_client, live).load_state("late")
        assert st is not None and st.last_seq == len(first) and st.status.value == "COMPLETED"
        assert st.rejected_total == 0
    finally:
        keys = list(redis_client.scan_iter(match=f"{target}:*"))
        if keys:
            redis_client.delete(*keys)


def test_a_swap_under_a_running_projector_is_adopted_and_the_projection_goes_on(
    topics: Settings, redis_client: redis.Redis, tmp_path: Path
) -> None:
    live = topics.redis_prefix
    store = RedisStore(redis_client, live)
    runs = [full_run(f"sw-{i}", stages=6) for i in range(6)]
    halves = [(evs[: len(evs) // 2], evs[len(evs) // 2:]) for evs in runs]
    log = tmp_path / "projector.log"
    proc = start_projector(topics, f"{topics.topic_prefix}proj", log=log)
    try:
        produce(topics, [e for first, _ in halves for e in first])
        firsts = [first for first, _ in halves]
        assert wait_until(caught_up(store, firsts), 120, every=0.5), log.read_text()[-3000:]
        gen = store.marker()
        out = cli(topics, "--swap", "--target", f"{live}.swapped", "--quiet")
        assert out.returncode == 0, out.stdout + out.stderr
        assert "swapped" in out.stdout
        assert store.marker() != gen  # a new generation: the projector must adopt it
        produce(topics, [e for _, second in halves for e in second])
        assert wait_until(caught_up(store, runs), 120, every=0.5), log.read_text()[-3000:]
        assert proc.poll() is None, "the projector stopped"
    finally:
        stop(proc)
        keys = list(redis_client.scan_iter(match=f"{live}.swapped:*"))
        if keys:
            redis_client.delete(*keys)
    assert "adopted generation" in log.read_text()
    out = cli(topics, "--diff", "--target", f"{live}:check", "--quiet")
    assert out.returncode == 0, out.stdout + out.stderr
    for evs in runs:
        st = store.load_state(evs[0].run_id)
        assert st is not None and st.status.value == "COMPLETED" and st.rejected_total == 0
