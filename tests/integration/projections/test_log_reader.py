"""``runlog.projections.log_reader`` against a real broker: a range, a run, the whole topic, empty
partitions, a topic that does not exist, a read that makes no progress."""

from __future__ import annotations

import re
import uuid

import pytest

from runlog.projections.log_reader import LogReader, read_range, read_run, read_topic
from runlog.schemas import RunEvent, RunlogError, Settings, Topics, partition_for
from tests.integration.processors.harness import CODEC, produce
from tests.unit.projections.runlogs import full_run

pytestmark = pytest.mark.integration


def _neighbour(run_id: str, partitions: int) -> str:
    """Another run id on ``run_id``'s partition."""
    p = partition_for(run_id, partitions)
    return next(o for i in range(10_000) if partition_for(o := f"other-{i}", partitions) == p)


def test_a_range_reads_exactly_its_offsets_in_order_and_reports_progress(topics: Settings) -> None:
    rid = f"r-{uuid.uuid4().hex[:8]}"
    events = full_run(rid)
    produce(topics, events)
    p = partition_for(rid, topics.partitions)
    ticks: list[tuple[int, int]] = []
    with LogReader(topics) as r:
        marks = r.watermarks()
        assert sorted(marks) == list(range(topics.partitions))
        assert marks[p] == (0, len(events))
        assert all(hi == 0 for q, (_, hi) in marks.items() if q != p)
        got = [m for batch in r.batches({p: (2, len(events) - 1)}, progress=lambda d, t: ticks.append((d, t)))
               for m in batch]
        # the same reader reads again (a follower polls this way)
        again = list(r.records({p: (0, 1)}))
    assert [m.offset() for m in got] == list(range(2, len(events) - 1))
    assert [CODEC.decode(m.value(), RunEvent) for m in got] == events[2:-1]
    assert ticks[0] == (0, len(events) - 3) and ticks[-1] == (len(events) - 3, len(events) - 3)
    assert [m.offset() for m in again] == [0]
    # the one-shot form
    assert [m.offset() for b in read_range(topics, {p: (0, 3)}) for m in b] == [0, 1, 2]


def test_a_run_is_its_own_decodable_events_from_an_offset(topics: Settings) -> None:
    rid = f"r-{uuid.uuid4().hex[:8]}"
    other = _neighbour(rid, topics.partitions)
    mine, theirs = full_run(rid), full_run(other)
    # interleaved on one partition, with a record keyed by the run that is not an event
    produce(topics, [mine[0], theirs[0], (rid.encode(), b"not an event"), *mine[1:], *theirs[1:]])
    got = list(read_run(topics, rid))
    assert [ev for _, ev in got] == mine
    assert [off for off, _ in got] == [0, *range(3, 3 + len(mine) - 1)]
    # the partition is looked up unless given; a start offset cuts the head
    tail = list(read_run(topics, rid, partition_for(rid, topics.partitions), from_offset=got[3][0]))
    assert [ev for _, ev in tail] == mine[3:]
    with LogReader(topics) as r:
        assert r.partition_of(rid) == partition_for(rid, topics.partitions)
        assert [ev for _, ev in r.run_events(other)] == theirs
    assert list(read_run(topics, f"nobody-{uuid.uuid4().hex[:6]}")) == []


def test_the_whole_topic_ends_at_the_high_watermarks_taken_at_start(topics: Settings) -> None:
    runs = [full_run(f"w{i}-{uuid.uuid4().hex[:6]}") for i in range(6)]
    n = produce(topics, [e for run in runs for e in run])
    ranges: dict[int, tuple[int, int]] = {}
    reading = read_topic(topics, ranges_out=ranges)
    first = next(reading)
    assert sum(hi - lo for lo, hi in ranges.values()) == n
    produce(topics, full_run(f"late-{uuid.uuid4().hex[:6]}"))  # appended while reading: not read
    seen = [*first, *(m for batch in reading for m in batch)]
    assert len(seen) == n
    assert {(m.partition(), m.offset()) for m in seen} == {
        (p, o) for p, (lo, hi) in ranges.items() for o in range(lo, hi)}
    by_part: dict[int, list[int]] = {}
    for m in seen:
        by_part.setdefault(m.partition(), []).append(m.offset())
    assert all(offs == sorted(offs) for offs in by_part.values())
    # from given offsets: only what lies beyond them
    with LogReader(topics) as r:
        marks = r.watermarks()
        rest = r.topic_ranges({p: hi for p, (_, hi) in ranges.items()})
    assert sum(hi - lo for lo, hi in rest.values()) == sum(hi for _, hi in marks.values()) - n


def test_empty_partitions_read_nothing_and_end_at_once(topics: Settings) -> None:
    ticks: list[tuple[int, int]] = []
    ranges: dict[int, tuple[int, int]] = {}
    assert list(read_topic(topics, ranges_out=ranges, progress=lambda d, t: ticks.append((d, t)))) == []
    assert ranges == dict.fromkeys(range(topics.partitions), (0, 0))
    assert ticks == [(0, 0)]
    assert list(read_run(topics, "no-such-run")) == []
    assert list(read_range(topics, {0: (0, 0), 1: (5, 3)})) == []


def test_a_topic_that_does_not_exist_is_a_runlog_error(settings: Settings) -> None:
    events = re.escape(Topics.of(settings).events)
    with LogReader(settings, timeout=1.0) as r, pytest.raises(RunlogError, match=events):
        list(r.run_events("r-1"))  # the fixture created no topic
    with LogReader(settings, f"{settings.topic_prefix}nothing-here", timeout=1.0) as r, \
            pytest.raises(RunlogError, match="nothing-here"):
        r.watermarks()


def test_a_read_that_gets_nothing_while_records_are_due_stops_with_no_progress(topics: Settings) -> None:
    produce(topics, full_run("stall"))
    p = partition_for("stall", topics.partitions)
    with LogReader(topics, stall_s=1.0, poll_timeout=0.2) as r:
        hi = r.watermarks([p])[p][1]
        with pytest.raises(RunlogError, match=re.escape(f"no progress reading '{Topics.of(topics).events}'")):
            list(r.records({p: (0, hi + 5)}))  # five records that never come
