"""A parallel audit's merge: auditors fed disjoint partitions, merged, report what one auditor fed
every record reports, whatever order the partitions' records interleaved in."""

from __future__ import annotations

import dataclasses
import pickle
import random

import pytest

from runlog.processors.audit import AuditOptions, Auditor, RunAnchors
from runlog.projections import RunState, RunStatus
from runlog.projections.internal import split_partitions
from runlog.schemas import Codec, EventType, RunEvent
from tests.unit.audit.test_auditor import run

CODEC = Codec()

Record = tuple[int, int, bytes, bytes]


def topic() -> list[Record]:
    """Four partitions: clean runs, an effect executed twice, a rewritten event, a fenced writer, an
    undecodable record, one delivery key shared by runs on two partitions, an open intent."""
    parts: dict[int, list[RunEvent]] = {
        0: run("a0") + run("a1", effect_results=2),
        1: run("b0") + run("b1", complete=False),
        2: run("c0"),
        3: run("d0"),
    }
    evs = parts[1]
    evs[2] = dataclasses.replace(evs[2], stage="rewritten")  # chain broken after it
    parts[2].append(RunEvent("c0", 3, 0, type=EventType.STAGE_STARTED, stage="a", occurred_at=9))  # fenced
    shared = [dataclasses.replace(e, delivery_key="dk-shared") if e.delivery_key else e for e in run("d1")]
    parts[3] += shared
    parts[0] += [dataclasses.replace(e, run_id="a2", delivery_key="dk-shared") if e.delivery_key else
                 dataclasses.replace(e, run_id="a2") for e in run("a2")]
    out: dict[int, list[Record]] = {}
    for p, events in parts.items():
        out[p] = [(p, off, e.run_id.encode(), CODEC.encode(e)) for off, e in enumerate(events)]
    out[2].append((2, len(out[2]), b"junk", b"\x00not an event"))
    merged: list[Record] = []
    rng = random.Random(41)
    queues = {p: list(recs) for p, recs in out.items()}
    while queues:  # interleaved as a reader's fetches come back, each partition in order
        p = rng.choice(sorted(queues))
        merged.append(queues[p].pop(0))
        if not queues[p]:
            del queues[p]
    return merged


ANCHORS = {"a0": RunAnchors("a0", 0, 99), "gone": RunAnchors.of(
    RunState(run_id="gone", status=RunStatus.RUNNING, last_seq=3, last_hash="f" * 64))}


def one(records: list[Record], options: AuditOptions) -> dict[str, object]:
    a = Auditor("events", options, anchors=ANCHORS)
    for r in records:
        a.feed(*r)
    return a.finish().to_dict()


def parallel(records: list[Record], options: AuditOptions, workers: int) -> dict[str, object]:
    groups = split_partitions(sorted({r[0] for r in records}), workers)
    parts = []
    for g in groups:
        a = Auditor("events", options)
        for r in records:
            if r[0] in g:
                a.feed(*r)
        parts.append(pickle.loads(pickle.dumps(a.partial())))  # as a worker process sends it back
    return Auditor.merged("events", parts, options, anchors=ANCHORS).finish().to_dict()


@pytest.mark.parametrize("workers", [2, 3, 4])
def test_merged_partial_audits_equal_one_audit(workers: int) -> None:
    recs = topic()
    opts = AuditOptions(check_artifacts=False)
    want = one(recs, opts)
    kinds = {f["kind"] for f in want["findings"]}  # type: ignore[attr-defined]
    assert {"effect_twice", "hash_chain", "rejected_event", "undecodable", "truncated"} <= kinds
    assert want["shared_delivery_keys"] == {"dk-shared": ["a2", "d1"]}
    assert parallel(recs, opts, workers) == want


def test_the_order_of_a_report_does_not_depend_on_how_partitions_interleaved() -> None:
    recs = topic()
    by_partition = sorted(recs, key=lambda r: (r[0], r[1]))
    opts = AuditOptions(check_artifacts=False)
    assert one(recs, opts) == one(by_partition, opts)


def test_two_partials_holding_one_run_are_refused() -> None:
    recs = [r for r in topic() if r[0] == 0]
    parts = []
    for _ in range(2):
        a = Auditor("events")
        for r in recs:
            a.feed(*r)
        parts.append(a.partial())
    with pytest.raises(ValueError, match="two partial audits"):
        Auditor.merged("events", parts)


def test_split_partitions_deals_every_partition_once() -> None:
    assert split_partitions([3, 0, 1, 2, 4], 2) == [[0, 2, 4], [1, 3]]
    assert split_partitions([0, 1], 4) == [[0], [1]]
    assert split_partitions([], 3) == [[]]
    with pytest.raises(ValueError):
        split_partitions([0], 0)
