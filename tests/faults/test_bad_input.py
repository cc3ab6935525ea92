"""Bad input for the codec and the projector's batch path, against the real Redis.

A hypothesis fuzz mixes good runs with random and mutated records: nothing
raises, every bad record becomes a dead letter with a reason (and the headers
the dead-letter topic carries), every good record is projected. Then one test
per defined outcome: oversized records, a newer schema's event types, events
for runs that never started, and seq gaps.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import replace
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from processors.dlq import H_OFFSET, H_REASON, parse_headers, to_record
from processors.faults import PointEntry, write_section
from projections import BatchProjector, RawRecord, RedisStore, RunStatus
from schemas import Codec, DecodeError, EventType, RunEvent, Settings
from tests.unit.projections.runlogs import full_run
from tests.unit.schemas.test_codec import base_dict, encode_with, v2_schema

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CODEC = Codec()
REASONS = DecodeError.REASONS | {"key_mismatch"}
_n = itertools.count()
_seen: list[PointEntry] = []


def _projector(client: redis.Redis, settings: Settings,
               codec: Codec = CODEC) -> tuple[BatchProjector, RedisStore]:
    store = RedisStore(client, f"{settings.redis_prefix}:fz{next(_n)}")
    return BatchProjector(store, codec), store


def _mutate(rnd: random.Random, data: bytes) -> bytes:
    kind = rnd.randrange(4)
    if kind == 0:
        return data[: rnd.randrange(len(data))]
    if kind == 1:
        b = bytearray(data)
        for _ in range(rnd.randint(1, 4)):
            b[rnd.randrange(len(b))] ^= 1 << rnd.randrange(8)
        return bytes(b)
    if kind == 2:
        return rnd.randbytes(rnd.randint(0, 64))
    return data[:10] + rnd.randbytes(rnd.randint(0, 40))


@hsettings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), runs=st.integers(1, 4), bad=st.integers(1, 30),
       batch=st.integers(1, 50))
def test_fuzz_bad_records_are_dead_letters_and_good_ones_are_projected(
    redis_client: redis.Redis, settings: Settings, seed: int, runs: int, bad: int, batch: int
) -> None:
    rnd = random.Random(seed)
    good_runs = {f"good-{seed}-{i}": full_run(f"good-{seed}-{i}", stages=1 + i % 6, calls=1)
                 for i in range(runs)}
    pool = [e for evs in good_runs.values() for e in evs]
    records: list[RawRecord] = []
    queues = {r: list(evs) for r, evs in good_runs.items()}
    bad_left = bad
    while any(queues.values()) or bad_left:
        live = [r for r, q in queues.items() if q]
        if bad_left and (not live or rnd.random() < 0.4):
            bad_left -= 1
            value = _mutate(rnd, CODEC.encode(rnd.choice(pool)))
            records.append(RawRecord("t", 0, len(records), f"junk-{len(records)}".encode(), value))
            continue
        ev = queues[rnd.choice(live)].pop(0)
        records.append(RawRecord("t", 0, len(records), ev.run_id.encode(), CODEC.encode(ev)))
    proj, store = _projector(redis_client, settings)
    dead = []
    for i in range(0, len(records), batch):
        res = proj.process(records[i:i + batch])
        dead.extend(res.dead_letters)
    junk = {r.offset for r in records if r.key is not None and r.key.startswith(b"junk-")}
    assert {d.record.offset for d in dead} == junk  # every bad record, and only those
    for d in dead:
        assert d.reason in REASONS, d
        headers = parse_headers(to_record(d).headers)
        assert headers[H_REASON] == d.reason and headers[H_OFFSET] == str(d.record.offset)
    states = store.load_states(good_runs)
    for run_id, evs in good_runs.items():
        assert states[run_id].last_seq == len(evs) and states[run_id].rejected_total == 0
        want = RunStatus.COMPLETED if evs[-1].type is EventType.RUN_COMPLETED else RunStatus.RUNNING
        assert states[run_id].status is want
    _seen.append(PointEntry(f"fuzz seed={seed}", "dead_lettered", completed=False,
                            detail={"records": len(records), "dead_letters": len(dead),
                                    "reasons": sorted({d.reason for d in dead})}))


def test_oversized_record_is_a_dead_letter_and_refused_on_write(redis_client: redis.Redis,
                                                               settings: Settings) -> None:
    big = RunEvent("big", 1, 1, EventType.RUN_STARTED, 1, attributes={"blob": "x" * 5000})
    data = Codec().encode(big)
    small = Codec(max_record_bytes=2000)
    with pytest.raises(DecodeError) as err:
        small.encode(big)
    assert err.value.reason == "oversized"
    proj, store = _projector(redis_client, settings, small)
    res = proj.process([RawRecord("t", 0, 0, b"big", data)])
    assert [d.reason for d in res.dead_letters] == ["oversized"]
    assert store.load_state("big") is None


def test_newer_schema_event_type_holds_its_seq_and_unknown_schema_is_a_dead_letter(
    redis_client: redis.Redis, settings: Settings
) -> None:
    codec = Codec()
    evs = full_run("evolve", stages=1, calls=1)
    newer = encode_with(v2_schema(), {**base_dict("RUN_PAUSED"), "run_id": "evolve",
                                      "seq": len(evs) + 1, "cost_cents": 3}, codec)
    after = replace(evs[0], seq=len(evs) + 2, type=EventType.STAGE_STARTED, stage="verify", workflow=None,
                    input_versions={})
    stranger = encode_with(v2_schema(), {**base_dict("RUN_PAUSED"), "run_id": "evolve", "cost_cents": 3},
                           Codec())
    recs = [RawRecord("t", 0, i, b"evolve", codec.encode(e)) for i, e in enumerate(evs)]
    recs += [RawRecord("t", 0, len(recs), b"evolve", newer),
             RawRecord("t", 0, len(recs) + 1, b"evolve", codec.encode(after))]
    proj, store = _projector(redis_client, settings, codec)
    res = proj.process(recs)
    state = store.load_state("evolve")
    assert state is not None and state.last_seq == len(evs) + 2 and state.stage == "verify"
    assert not res.dead_letters and res.applied == len(recs)
    # the same bytes from a writer whose schema this reader was never taught
    res = _projector(redis_client, settings, Codec())[0].process([RawRecord("t", 0, 0, b"evolve", stranger)])
    assert [d.reason for d in res.dead_letters] == ["unknown_schema"]


def test_events_for_unknown_runs_and_seq_gaps_are_rejected_not_applied(
    redis_client: redis.Redis, settings: Settings
) -> None:
    proj, store = _projector(redis_client, settings)
    orphan = RunEvent("orphan", 5, 1, EventType.TOOL_CALLED, 1, stage="draft", call_id="draft/x/0")
    headless = RunEvent("headless", 1, 1, EventType.STAGE_STARTED, 1, stage="draft")
    evs = full_run("gappy", stages=2, calls=1)
    gap = [evs[0], evs[1], evs[3]]  # seq 3 missing
    recs = [RawRecord("t", 0, i, e.run_id.encode(), CODEC.encode(e))
            for i, e in enumerate([orphan, headless, *gap])]
    res = proj.process(recs)
    assert res.rejected == {"seq_gap": 2}
    o, h, g = (store.load_state(r) for r in ("orphan", "headless", "gappy"))
    # an unknown run's event past seq 1: rejected, visible as a rejection, nothing applied
    assert o is not None and o.last_seq == 0 and o.rejected_total == 1 and o.workflow is None
    # a run whose first event is not RUN_STARTED: its seq is held and it shows RUNNING, but it has
    # no workflow, so a resume blocks it ("the run has no RUN_STARTED with a workflow")
    assert h is not None and h.last_seq == 1 and h.workflow is None and h.status is RunStatus.RUNNING
    # a gap: the event after it is rejected until the missing one arrives
    assert g is not None and g.last_seq == 2 and g.rejected_total == 1
    res = proj.process([RawRecord("t", 0, 10, b"gappy", CODEC.encode(evs[2])),
                        RawRecord("t", 0, 11, b"gappy", CODEC.encode(evs[3]))])
    g = store.load_state("gappy")
    assert g is not None and g.last_seq == 4 and res.applied == 2


def test_zz_write_bad_input_section(fault_report: Path) -> None:
    entries = list(_seen) + [PointEntry(n, o) for n, o in (
        ("oversized record", "dead_letter:oversized"),
        ("newer schema event type (writer schema known)", "accepted_as_UNKNOWN_holding_seq"),
        ("newer schema, writer schema unknown", "dead_letter:unknown_schema"),
        ("event for an unknown run (seq > 1)", "rejected:seq_gap"),
        ("first event not RUN_STARTED", "projected_RUNNING_without_workflow"),
        ("seq gap", "rejected:seq_gap_until_filled"))]
    write_section(fault_report, "bad_input", entries)
    assert _seen, "the fuzz test did not run before the report"
