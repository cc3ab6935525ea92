"""Hash version 2 in the fold and the batch projector: the hash is the sha256 of the record's Avro
body as received, never a re-encoding; version-1 events keep their canonical-JSON hash; both versions
mix in one run and one topic."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from runlog.projections import BatchProjector, MemoryStore, RawRecord, decode_records, fold, fold_all
from runlog.projections.fold import event_digest
from runlog.schemas import Codec, RunEvent, event_hash
from runlog.schemas._codec import body_of
from runlog.schemas._hash import HASH_VERSION, current_body
from tests.unit.projections.hash_v2_runs import body_sha, chain, edited, event, newer_schema, older_schema

TOPIC = "t.runlog.events"


def records(items: list[tuple[RunEvent, bytes]], partition: int = 0, start: int = 0) -> list[RawRecord]:
    return [RawRecord(TOPIC, partition, start + i, ev.run_id.encode(), data)
            for i, (ev, data) in enumerate(items)]


def test_the_version_2_hash_is_the_sha256_of_the_body_as_written() -> None:
    codec = Codec()
    ev = event("r", 2, "ab" * 32)
    assert ev.hash_version == HASH_VERSION == 2
    data = codec.encode(ev)
    decoded, body = codec.decode_with_body(data, RunEvent)
    assert decoded == ev and body == data[10:] == body_of(data) == current_body(ev)
    assert event_hash(ev, body) == hashlib.sha256(data[10:]).hexdigest() == event_hash(ev)
    # every field counts (the hash covers the whole body), the version too
    for change in ({"seq": 3}, {"stage": "x"}, {"prev_hash": "0" * 64}, {"attributes": {"k": "v"}}):
        assert event_hash(edited(ev, **change)) != event_hash(ev), change
    assert event_hash(edited(ev, hash_version=1)) != event_hash(ev)
    # a reader older than a later version hashes it as 2: the body
    v3 = edited(ev, hash_version=3)
    assert event_hash(v3, b"xyz") == hashlib.sha256(b"xyz").hexdigest()


def test_a_version_1_event_hashes_as_before_whatever_body_it_came_with() -> None:
    ev = event("r", 2, "ab" * 32, version=1)
    data = Codec().encode(ev)
    assert event_hash(ev, body_of(data)) == event_hash(ev) != body_sha(data)
    # hash_version 1 is the default: left out of the canonical JSON, so old hashes stay valid
    old = RunEvent(ev.run_id, ev.seq, ev.epoch, ev.type, ev.occurred_at, stage=ev.stage, call_id=ev.call_id,
                   tool=ev.tool, prev_hash=ev.prev_hash)
    assert event_hash(old) == event_hash(ev)


@pytest.mark.parametrize("writer", [newer_schema(), older_schema()], ids=["newer", "older"])
def test_the_projector_hashes_the_received_bytes_not_a_re_encoding(writer: dict[str, Any]) -> None:
    """Events written with another version of the schema: re-encoding them with this reader's schema
    gives other bytes, so a fold that re-encoded would keep a last_hash no writer chained to."""
    codec = Codec()
    items = chain("r", 4, codec=codec, writer=writer, writer_from=2)
    reencoded = event_hash(items[-1][0])  # what re-encoding with the current schema would give
    assert reencoded != body_sha(items[-1][1])
    assert event_hash(items[1][0]) != items[2][0].prev_hash  # the chain breaks under re-encoding
    store = MemoryStore()
    res = BatchProjector(store, codec).process(records(items))
    assert res.applied == 4 and not res.dead_letters
    state = store.load_state("r")
    assert state is not None and state.last_hash == body_sha(items[-1][1]) != reencoded
    # what the writers chained is what the fold keeps: each prev_hash is the previous last_hash
    good, _ = decode_records(codec, records(items))
    assert [h for _, _, h in good] == [body_sha(d) for _, d in items]
    assert [ev.prev_hash for ev, _, _ in good[1:]] == [h for _, _, h in good[:-1]]
    assert fold_all(good) == state


def test_a_retried_record_is_a_duplicate_by_its_received_hash() -> None:
    codec = Codec()
    items = chain("r", 3, codec=codec, writer=newer_schema(), writer_from=1)
    good, _ = decode_records(codec, records(items) + records(items[-1:], start=3))
    state = fold_all(good[:3])
    again, out = fold(state, good[3][0], good[3][1], content_hash=good[3][2])
    assert out.reason == "same_content" and again is state
    assert state is not None and state.recent[-1] == (3, body_sha(items[-1][1])[:32])
    assert event_digest(good[3][0], body_of(items[-1][1])) == state.recent[-1][1]


def test_version_1_and_version_2_events_in_one_run_and_one_topic() -> None:
    codec = Codec()
    mixed = chain("r-mixed", 5, codec=codec, versions=(1, 1, 2, 2, 2))  # an upgrade mid-run
    old = chain("r-old", 3, codec=codec, versions=(1, 1, 1))
    new = chain("r-new", 3, codec=codec)
    assert mixed[2][0].prev_hash == event_hash(mixed[1][0])  # v2 event after a v1 one: its v1 hash
    assert mixed[3][0].prev_hash == body_sha(mixed[2][1])
    recs = [*records(mixed), *records(old, start=5), *records(new, start=8)]
    store = MemoryStore()
    res = BatchProjector(store, codec).process(recs)
    assert res.applied == 11 and not res.rejected
    for run_id, items in (("r-mixed", mixed), ("r-old", old), ("r-new", new)):
        state = store.load_state(run_id)
        ev, data = items[-1]
        expected = event_hash(ev) if ev.hash_version == 1 else body_sha(data)
        assert state is not None and state.last_hash == expected, run_id


def test_an_edited_version_2_record_no_longer_matches_its_successors_prev_hash() -> None:
    codec = Codec()
    items = chain("r", 3, codec=codec)
    ev2, _ = items[1]
    forged = codec.encode(edited(ev2, tool="other"))  # same seq, same prev_hash, other content
    good, _ = decode_records(codec, records([items[0], (ev2, forged), items[2]]))
    assert good[1][2] != items[2][0].prev_hash
    state = fold_all(good)
    assert state is not None and state.last_seq == 3  # the fold accepts; the audit names the break
