"""The projector's offset guard against the real broker: records the consumer skipped are read from the
log and applied before the batch after them, from the group's committed offset (issue 24's skip)."""

from __future__ import annotations

import pytest
import redis
from confluent_kafka import Consumer, TopicPartition

from runlog.processors.projector._offsets import LogGaps, OffsetGuard, kafka_committed
from runlog.projections import RedisStore, diff_namespaces
from runlog.projections.batch import BatchProjector, RawRecord
from runlog.projections.log_reader import LogReader
from runlog.schemas import Codec, Settings, Topics
from tests.unit.projections.runlogs import full_run

from .harness import interleave, produce, reference

pytestmark = pytest.mark.integration


def _records(settings: Settings) -> dict[int, list[RawRecord]]:
    topic = Topics.of(settings).events
    out: dict[int, list[RawRecord]] = {}
    with LogReader(settings, topic, name="t-guard") as r:
        for m in r.records(r.topic_ranges()):
            out.setdefault(m.partition(), []).append(
                RawRecord(topic, m.partition(), m.offset(), m.key(), m.value()))
    return out


def _commit(settings: Settings, group: str, offsets: dict[int, int]) -> None:
    c = Consumer(settings.consumer_config(group))
    try:
        c.commit(offsets=[TopicPartition(Topics.of(settings).events, p, o) for p, o in offsets.items()],
                 asynchronous=False)
    finally:
        c.close()


def test_a_batch_after_skipped_records_applies_them_first_from_the_committed_offset(
    topics: Settings, redis_client: redis.Redis
) -> None:
    runs = [full_run(f"g{i:03d}", stages=2, calls=1) for i in range(40)]
    produce(topics, [ev for r in runs for ev in r])
    by_part = _records(topics)
    p, recs = max(by_part.items(), key=lambda kv: len(kv[1]))
    assert len(recs) >= 30
    group = topics.group_id("guard")
    _commit(topics, group, {p: recs[5].offset})  # the group applied everything before recs[5]

    committed, close_c = kafka_committed(topics, group, Topics.of(topics).events)
    gaps = LogGaps(topics, Topics.of(topics).events)
    guard = OffsetGuard(committed, gaps.range)
    store = RedisStore(redis_client, topics.redis_prefix)
    core = BatchProjector(store, Codec.from_settings(topics))
    try:
        # the records before recs[5] were applied by the member that committed them
        core.process(recs[:5])
        # the consumer skipped recs[5:20] (dropped across a rebalance) and delivers recs[20:] next
        full, filled = guard.complete(recs[20:25])
        assert [r.offset for r in filled] == [r.offset for r in recs[5:20]]
        assert [r.offset for r in full] == [r.offset for r in recs[5:25]]
        core.process(full)
        guard.applied(full)
        assert guard.next_offsets()[p] == recs[24].offset + 1
        # in order from there: nothing filled; a redelivery (below the next offset) is harmless
        full, filled = guard.complete([*recs[23:25], *recs[25:]])
        assert filled == [] and full[0].offset == recs[23].offset
        core.process(full)
        guard.applied(full)
        # other partitions, nothing committed: the guard starts at their low watermark
        for q, others in by_part.items():
            if q == p:
                continue
            full, filled = guard.complete(others[3:])
            assert [r.offset for r in filled] == [r.offset for r in others[:3]]
            core.process(full)
            guard.applied(full)
    finally:
        close_c()
        gaps.close()
    ref = reference(topics, redis_client)
    assert diff_namespaces(redis_client, topics.redis_prefix, ref) == []
    states = store.load_states([r[0].run_id for r in runs])
    assert {rid: st.last_seq for rid, st in states.items()} == {r[0].run_id: len(r) for r in runs}


def test_a_run_whose_state_has_a_seq_gap_is_refolded_from_its_partition(
    topics: Settings, redis_client: redis.Redis
) -> None:
    """The second line of defence: records skipped with no guard in front; a run with a projected
    state heals from its partition when its next event arrives (without the heal: rejected for good)."""
    runs = [full_run(f"h{i:03d}", stages=2, calls=1) for i in range(40)]
    produce(topics, interleave(runs))
    _, recs = max(_records(topics).items(), key=lambda kv: len(kv[1]))
    keys = {r.key for r in recs}
    started = {r.key for r in recs[:5]}
    length = {r[0].run_id.encode(): len(r) for r in runs}
    gaps = LogGaps(topics, Topics.of(topics).events)
    healed = BatchProjector(RedisStore(redis_client, topics.redis_prefix), Codec.from_settings(topics),
                            heal=gaps.run)
    plain = BatchProjector(RedisStore(redis_client, f"{topics.redis_prefix}:plain"),
                           Codec.from_settings(topics))
    try:
        for core in (healed, plain):
            core.process(recs[:5])
            core.process(recs[20:])  # recs[5:20] skipped
    finally:
        gaps.close()
    assert healed.heals >= 1
    ids = [k.decode() for k in keys if k in started]
    fixed = healed.store.load_states(ids)
    broken = plain.store.load_states(ids)
    assert {r: s.last_seq for r, s in fixed.items()} == {r: length[r.encode()] for r in ids}
    assert any(s.last_seq < length[r.encode()] for r, s in broken.items())
    assert any(s.rejected.get("seq_gap") for s in broken.values())
