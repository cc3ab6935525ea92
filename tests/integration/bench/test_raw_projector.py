"""The projector's raw baseline consumes the events itself (a plain consumer, batched ``consume``)
and applies every one: each run's projected ``last_seq`` in Redis is its last event's."""

from __future__ import annotations

import pytest

from runlog.processors.bench._env import BenchEnv
from runlog.processors.bench._events import history
from runlog.processors.bench._read import RawProjector, consume_and_apply, populate
from runlog.projections import fold_all
from runlog.schemas import Settings, Topics

pytestmark = pytest.mark.integration


def test_the_raw_projector_consumes_and_applies_every_event(settings: Settings) -> None:
    env = BenchEnv(settings)
    try:
        s = env.settings("rawproj")
        ids = populate(env, s, events=1_200, runs=12, tag="rp")  # 100 events a run, interleaved
        templates = {r: st for r in ids if (st := fold_all(history(r, 1, 100))) is not None}
        prefix = f"{s.redis_prefix}.raw"
        n, secs = consume_and_apply(s, Topics.of(s).events, RawProjector(env, prefix, templates), batch=50)
        assert n == 1_200 and secs > 0
        assert env.last_seqs(prefix, ids) == [100] * 12
    finally:
        env.close()


def test_a_flushed_script_cache_is_loaded_again_by_the_baseline_and_the_watcher(settings: Settings) -> None:
    """``SCRIPT FLUSH`` (or a Redis restart) between two batches: the raw projector and the lag watcher
    load their scripts again instead of failing with ``NoScriptError``."""
    env = BenchEnv(settings)

    class Flushing(RawProjector):
        flushes = 0

        def apply(self, batch: list[tuple[int, int, bytes, bytes]]) -> None:
            super().apply(batch)
            env.redis.script_flush()  # every script is gone before the next batch
            self.flushes += 1

    try:
        s = env.settings("rawflush")
        ids = populate(env, s, events=600, runs=6, tag="rf")
        templates = {r: st for r in ids if (st := fold_all(history(r, 1, 100))) is not None}
        prefix = f"{s.redis_prefix}.raw"
        rp = Flushing(env, prefix, templates)
        n, _ = consume_and_apply(s, Topics.of(s).events, rp, batch=50)
        assert n == 600 and rp.flushes >= 2
        assert env.last_seqs(prefix, ids) == [100] * 6
        env.redis.script_flush()
        assert env.last_seqs(prefix, ids) == [100] * 6
    finally:
        env.close()
