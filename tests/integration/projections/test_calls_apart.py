"""A run's calls are fields of their own in its state hash (``runlog.projections._layout``): an apply
writes the calls that changed and drops the ones gone; a whole write drops every stale call field;
a hash written with the calls inline (the earlier layout) still reads, and is written whole next."""

from __future__ import annotations

import json

import pytest
import redis

from runlog.projections import RedisStore
from runlog.projections._layout import CALL_FIELD, apply_argv
from runlog.projections._state import state_to_json
from runlog.projections.store import ApplyResult, RunUpdate
from runlog.schemas import Settings
from tests.unit.projections.runlogs import RunBuilder, full_run
from tests.unit.projections.store_contract import fold_updates

pytestmark = pytest.mark.integration


def _call_fields(r: redis.Redis, key: str) -> set[str]:
    return {k.decode()[len(CALL_FIELD):] for k in r.hkeys(key) if k.startswith(CALL_FIELD.encode())}


def test_each_apply_sends_only_the_calls_that_changed_and_drops_the_ones_gone(
        settings: Settings, redis_client: redis.Redis) -> None:
    store = RedisStore(redis_client, settings.redis_prefix)
    events = full_run("run-apart", stages=3, calls=4)
    ups = fold_updates(events)
    key = store.state_key("run-apart")
    for u in ups:
        argv = apply_argv(u, u.base_calls)
        n = int(argv[4])
        names = [str(f) for f in argv[5:5 + 2 * n:2]]
        sent = {f[len(CALL_FIELD):] for f in names if f.startswith(CALL_FIELD)}
        n_dropped = int(argv[5 + 2 * n])
        dropped = {str(f)[len(CALL_FIELD):] for f in argv[6 + 2 * n:6 + 2 * n + max(n_dropped, 0)]}
        base = u.base_calls or {}
        assert sent == {c for c, rec in u.state.calls.items() if base.get(c) is not rec}
        assert dropped == set(base) - set(u.state.calls)
        assert n_dropped == (-1 if u.base_calls is None else len(dropped))
        store.apply([u])
        assert _call_fields(redis_client, key) == set(u.state.calls)  # dropped at checkpoints too
        assert store.load_state("run-apart") == u.state
    assert any(not u.state.calls and u.base_calls for u in ups), "no checkpoint dropped calls"


def test_a_whole_write_drops_call_fields_the_state_does_not_have(settings: Settings,
                                                                 redis_client: redis.Redis) -> None:
    store = RedisStore(redis_client, settings.redis_prefix)
    ups = fold_updates(RunBuilder("run-whole").start().stage("draft", 3, verify=False).events)
    store.apply(ups)
    key = store.state_key("run-whole")
    redis_client.hset(key, CALL_FIELD + "stale/call/1", "{}")
    last = ups[-1].state
    assert len(last.calls) == 3
    redis_client.hset(key, "offset", str(last.offset - 1))  # let a whole rewrite of the same state apply
    store.apply([RunUpdate(last, last.offset - 1, last.status)])  # base_calls None: whole
    assert _call_fields(redis_client, key) == set(last.calls)
    assert store.load_state("run-whole") == last


def test_a_hash_with_calls_inline_reads_and_is_written_whole_next(settings: Settings,
                                                                  redis_client: redis.Redis) -> None:
    store = RedisStore(redis_client, settings.redis_prefix)
    events = RunBuilder("run-old").start().stage("draft", 3, verify=False).events
    ups = fold_updates(events)
    store.apply(ups[:-1])
    key = store.state_key("run-old")
    before = ups[-2].state
    assert before.calls
    # the earlier layout: the whole state in the snapshot, no call fields, no "calls" marker
    redis_client.hdel(key, "calls", *(CALL_FIELD + c for c in before.calls))
    redis_client.hset(key, "snapshot", state_to_json(before))
    fresh = RedisStore(redis_client, settings.redis_prefix)
    assert fresh.load_state("run-old") == before
    fresh.apply([ups[-1]])  # carries base_calls: the store still writes every call
    assert _call_fields(redis_client, key) == set(ups[-1].state.calls)
    assert json.loads(redis_client.hget(key, "snapshot"))["calls"] == []  # type: ignore[arg-type]
    assert RedisStore(redis_client, settings.redis_prefix).load_state("run-old") == ups[-1].state


def test_a_calls_only_write_onto_a_hash_in_the_earlier_layout_is_a_conflict(
        settings: Settings, redis_client: redis.Redis) -> None:
    """A writer that did not load the run (its base from a cache, or a hash a failover took back to
    the earlier layout) must not send only its changed calls there: the unchanged ones would be
    lost. The script answers CONFLICT; the writer reloads the run and writes it whole."""
    store = RedisStore(redis_client, settings.redis_prefix)
    ups = fold_updates(RunBuilder("run-back").start().stage("draft", 3, verify=False).events)
    store.apply(ups[:-1])
    key = store.state_key("run-back")
    before = ups[-2].state
    redis_client.hdel(key, "calls", *(CALL_FIELD + c for c in before.calls))
    redis_client.hset(key, "snapshot", state_to_json(before))
    assert ups[-1].base_calls is not None
    assert store.apply([ups[-1]]) == [ApplyResult.CONFLICT]  # this store never loaded it
    assert RedisStore(redis_client, settings.redis_prefix).load_state("run-back") == before  # untouched
    assert store.load_state("run-back") == before  # reloaded: now known to need a whole write
    assert store.apply([ups[-1]]) == [ApplyResult.APPLIED]
    assert RedisStore(redis_client, settings.redis_prefix).load_state("run-back") == ups[-1].state
