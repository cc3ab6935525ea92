"""The audit over hash version 2: the chain is checked with the sha256 of each record's body as read
(never a re-encoding), still catches an edited event and a wrong prev_hash, accepts version-1 and
version-2 events in one run and one topic, and gives one hash under both framings."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import pytest

from runlog.processors.audit import Auditor
from runlog.schemas import Codec, RunEvent, Settings, event_hash
from tests.unit.projections.hash_v2_runs import body_sha, chain, newer_schema, older_schema


def audit(items: list[tuple[RunEvent, bytes]], codec: Codec | None = None) -> Auditor:
    a = Auditor("events", codec=codec or Codec())
    for off, (ev, data) in enumerate(items):
        a.feed(0, off, ev.run_id.encode(), data)
    a.finish()
    return a


def kinds(a: Auditor) -> list[tuple[str, str, int | None]]:
    return [(f.run_id, f.kind, f.seq) for f in a.report.findings]


def test_a_clean_version_2_run_has_no_findings_and_hashes_its_bodies() -> None:
    items = chain("r", 5)
    a = audit(items)
    assert kinds(a) == []
    hashes = [e["hash"] for e in a.report.runs["r"].events]
    assert hashes == [body_sha(d) for _, d in items]
    state = a.report.runs["r"].state
    assert state is not None and state.last_hash == body_sha(items[-1][1])


def test_an_edited_version_2_event_is_named_by_its_successor() -> None:
    codec = Codec()
    items = chain("r", 4, codec=codec)
    ev2 = items[1][0]
    forged = replace(ev2, tool="evil")  # same seq and prev_hash, other content, rewritten in place
    items[1] = (forged, codec.encode(forged))
    assert kinds(audit(items)) == [("r", "hash_chain", 2)]


def test_a_wrong_prev_hash_in_a_version_2_event_is_found() -> None:
    codec = Codec()
    items = chain("r", 4, codec=codec)
    ev3 = replace(items[2][0], prev_hash="0" * 64)
    items[2] = (ev3, codec.encode(ev3))
    a = audit(items)
    # seq 3 names another predecessor, and is itself no longer what seq 4 recorded
    assert kinds(a) == [("r", "hash_chain", 2), ("r", "hash_chain", 3)]
    assert "seq 3 records prev_hash 0000000000000000" in a.report.findings[0].detail


def test_version_1_and_version_2_in_one_run_and_one_topic() -> None:
    codec = Codec()
    items = [*chain("r-mixed", 5, codec=codec, versions=(1, 1, 2, 2)), *chain("r-old", 3, versions=(1, 1, 1)),
             *chain("r-new", 3, codec=codec)]
    a = audit(items)
    assert kinds(a) == []
    assert [e["hash"] for e in a.report.runs["r-mixed"].events] == [
        event_hash(items[0][0]), event_hash(items[1][0]), *(body_sha(d) for _, d in items[2:5])]
    # and an edit of the v1 event that a v2 event names is still caught
    forged = replace(items[1][0], tool="evil")
    items[1] = (forged, codec.encode(forged))
    assert kinds(audit(items)) == [("r-mixed", "hash_chain", 2)]


@pytest.mark.parametrize("writer", [newer_schema(), older_schema()], ids=["newer", "older"])
def test_events_of_another_writer_schema_chain_as_their_writer_hashed_them(writer: dict[str, Any]) -> None:
    codec = Codec()
    items = chain("r", 4, codec=codec, writer=writer, writer_from=2)
    # re-encoding with this reader's schema would break the chain at every event of that writer
    assert all(event_hash(items[i][0]) != items[i + 1][0].prev_hash for i in (1, 2))
    assert kinds(audit(items, codec)) == []


def test_registry_and_single_object_framing_give_one_chain() -> None:
    reg = Codec.from_settings(Settings(schema_registry_url=f"mock://runlog-hash-{uuid.uuid4().hex[:8]}"))
    plain = Codec()
    run: list[tuple[RunEvent, bytes]] = []
    prev = None
    for seq in range(1, 6):  # alternate framings within one run, chained over the body alone
        ev = chain("r", seq)[-1][0]
        ev = replace(ev, prev_hash=prev)
        data = (reg if seq % 2 else plain).encode(ev)
        prev = body_sha(data)
        run.append((ev, data))
    assert {d[:1] for _, d in run} == {b"\x00", b"\xc3"}
    assert all(body_sha(reg.encode(ev)) == body_sha(plain.encode(ev)) for ev, _ in run)
    assert kinds(audit(run, reg)) == []
