"""Bad input for the codec and the projector's batch path, against the real Redis and broker.

A hypothesis fuzz mixes good runs with random and mutated records: nothing
raises, every bad record becomes a dead letter with a reason (and the headers
the dead-letter topic carries), every good record is projected. Then one test
per defined outcome: oversized records, a newer schema's event types, events
for runs that never started, and seq gaps.

The report section is written from what the tests saw, not from a list of
claims: every test sends its dead letters, as the projector does
(``runlog.processors.dlq.to_record``), to a dead-letter topic on the broker, and
records the state it read back from Redis. The last test reads the topic back
once and builds each entry from the dead letters that came back (count and
reasons, matched to the test by the original-topic header) and the recorded
state; an outcome that is not the documented one (:data:`EXPECTED`) is a
failed point and fails the test.
"""

from __future__ import annotations

import itertools
import random
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import redis
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from runlog.processors.dlq import H_OFFSET, H_PARTITION, H_REASON, H_TOPIC, parse_headers, to_record
from runlog.projections import BatchProjector, DeadLetter, RawRecord, RedisStore, RunStatus
from runlog.schemas import Codec, DecodeError, EventType, RunEvent, Settings
from tests.conftest import Services
from tests.faults.machinery import PointEntry, write_section
from tests.integration.processors.harness import read_topic
from tests.unit.projections.runlogs import full_run
from tests.unit.schemas.test_codec import base_dict, encode_with, v2_schema

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CODEC = Codec()
REASONS = DecodeError.REASONS | {"key_mismatch"}
_n = itertools.count()

EXPECTED = {
    "oversized record": "dead_letter:oversized",
    "newer schema event type (writer schema known)": "accepted_as_UNKNOWN_holding_seq",
    "newer schema, writer schema unknown": "dead_letter:unknown_schema",
    "event for an unknown run (seq > 1)": "rejected:seq_gap",
    "first event not RUN_STARTED": "projected_RUNNING_without_workflow",
    "seq gap": "rejected:seq_gap_until_filled",
}
"""The defined outcomes as docs/faults.md ("Bad input") states them; the report must observe exactly these."""


@dataclass
class Seen:
    """What one test (or one fuzz example) saw; the report entry is made from it and the DLQ."""

    point: str
    source: str
    """The original-topic header of this point's dead letters (how they are found again)."""
    state_outcome: str | None = None
    """What the projection showed, for a point that is not about dead letters."""
    sent: dict[int, str] = field(default_factory=dict)
    """Offset -> reason of the dead letters the projector gave and the test sent to the DLQ."""
    expected_offsets: set[int] | None = None
    """Offsets that must come back as dead letters (the fuzz's junk records)."""
    detail: dict[str, Any] = field(default_factory=dict)


_seen: list[Seen] = []


@dataclass
class DeadLetterTopic:
    settings: Settings
    topic: str
    producer: Producer


@pytest.fixture(scope="module")
def dlq(services: Services) -> Iterator[DeadLetterTopic]:
    """A dead-letter topic of this module on the broker, read back by the report test."""
    tid = uuid.uuid4().hex[:10]
    s = Settings.from_env({}, kafka_bootstrap_servers=services.kafka_bootstrap_servers,
                          redis_url=services.redis_url, topic_prefix=f"t{tid}.", redis_prefix=f"t{tid}")
    topic = f"{s.topic_prefix}runlog.events.dlq"
    admin = AdminClient(s.admin_config())
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    try:
        yield DeadLetterTopic(s, topic, Producer(s.producer_config()))
    finally:
        admin.delete_topics([topic], operation_timeout=10)


def _send(dlq: DeadLetterTopic, dead: list[DeadLetter]) -> None:
    """Produce dead letters as the projector does, and wait until the broker has them."""
    for d in dead:
        rec = to_record(d)
        dlq.producer.produce(dlq.topic, key=rec.key, value=rec.value, headers=list(rec.headers))
    assert dlq.producer.flush(30) == 0


def _observe(dlq: DeadLetterTopic, point: str, source: str, dead: list[DeadLetter],
             state_outcome: str | None = None, **detail: Any) -> Seen:
    _send(dlq, dead)
    seen = Seen(point, source, state_outcome, {d.record.offset: d.reason for d in dead}, detail=detail)
    _seen.append(seen)
    return seen


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
    redis_client: redis.Redis, settings: Settings, dlq: DeadLetterTopic, seed: int, runs: int, bad: int,
    batch: int
) -> None:
    source = f"fuzz-{next(_n)}"
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
            records.append(RawRecord(source, 0, len(records), f"junk-{len(records)}".encode(), value))
            continue
        ev = queues[rnd.choice(live)].pop(0)
        records.append(RawRecord(source, 0, len(records), ev.run_id.encode(), CODEC.encode(ev)))
    proj, store = _projector(redis_client, settings)
    dead = []
    for i in range(0, len(records), batch):
        res = proj.process(records[i:i + batch])
        dead.extend(res.dead_letters)
    junk = {r.offset for r in records if r.key is not None and r.key.startswith(b"junk-")}
    states = store.load_states(good_runs)
    whole = sum(1 for r, evs in good_runs.items() if r in states and states[r].last_seq == len(evs))
    seen = _observe(dlq, f"fuzz seed={seed}", source, dead, records=len(records), good_runs=len(good_runs),
                    good_runs_projected_whole=whole)
    seen.expected_offsets = junk
    assert {d.record.offset for d in dead} == junk  # every bad record, and only those
    for d in dead:
        assert d.reason in REASONS, d
        headers = parse_headers(to_record(d).headers)
        assert headers[H_REASON] == d.reason and headers[H_OFFSET] == str(d.record.offset)
    for run_id, evs in good_runs.items():
        assert states[run_id].last_seq == len(evs) and states[run_id].rejected_total == 0
        want = RunStatus.COMPLETED if evs[-1].type is EventType.RUN_COMPLETED else RunStatus.RUNNING
        assert states[run_id].status is want


def test_oversized_record_is_a_dead_letter_and_refused_on_write(redis_client: redis.Redis,
                                                               settings: Settings,
                                                               dlq: DeadLetterTopic) -> None:
    big = RunEvent("big", 1, 1, EventType.RUN_STARTED, 1, attributes={"blob": "x" * 5000})
    data = Codec().encode(big)
    small = Codec(max_record_bytes=2000)
    with pytest.raises(DecodeError) as err:
        small.encode(big)
    assert err.value.reason == "oversized"
    proj, store = _projector(redis_client, settings, small)
    res = proj.process([RawRecord("oversized", 0, 0, b"big", data)])
    state = store.load_state("big")
    _observe(dlq, "oversized record", "oversized", res.dead_letters,
             None if state is None else f"projected_{state.status.value}", bytes=len(data), limit=2000)
    assert [d.reason for d in res.dead_letters] == ["oversized"]
    assert state is None


def test_newer_schema_event_type_holds_its_seq_and_unknown_schema_is_a_dead_letter(
    redis_client: redis.Redis, settings: Settings, dlq: DeadLetterTopic
) -> None:
    codec = Codec()
    evs = full_run("evolve", stages=1, calls=1)
    newer = encode_with(v2_schema(), {**base_dict("RUN_PAUSED"), "run_id": "evolve",
                                      "seq": len(evs) + 1, "cost_cents": 3}, codec)
    after = replace(evs[0], seq=len(evs) + 2, type=EventType.STAGE_STARTED, stage="verify", workflow=None,
                    input_versions={})
    stranger = encode_with(v2_schema(), {**base_dict("RUN_PAUSED"), "run_id": "evolve", "cost_cents": 3},
                           Codec())
    src = "newer-known"
    recs = [RawRecord(src, 0, i, b"evolve", codec.encode(e)) for i, e in enumerate(evs)]
    recs += [RawRecord(src, 0, len(recs), b"evolve", newer),
             RawRecord(src, 0, len(recs) + 1, b"evolve", codec.encode(after))]
    proj, store = _projector(redis_client, settings, codec)
    res = proj.process(recs)
    state = store.load_state("evolve")
    read_as = codec.decode(newer, RunEvent).type.value
    held = state is not None and state.last_seq == len(evs) + 2 and state.stage == "verify"
    _observe(dlq, "newer schema event type (writer schema known)", src, res.dead_letters,
             f"accepted_as_{read_as}_{'holding_seq' if held else 'not_holding_seq'}",
             applied=res.applied, records=len(recs), last_seq=None if state is None else state.last_seq)
    assert state is not None and state.last_seq == len(evs) + 2 and state.stage == "verify"
    assert not res.dead_letters and res.applied == len(recs)
    # the same bytes from a writer whose schema this reader was never taught
    src = "newer-unknown"
    res = _projector(redis_client, settings, Codec())[0].process([RawRecord(src, 0, 0, b"evolve", stranger)])
    _observe(dlq, "newer schema, writer schema unknown", src, res.dead_letters,
             f"accepted_{res.applied}" if res.applied else None)
    assert [d.reason for d in res.dead_letters] == ["unknown_schema"]


def test_events_for_unknown_runs_and_seq_gaps_are_rejected_not_applied(
    redis_client: redis.Redis, settings: Settings, dlq: DeadLetterTopic
) -> None:
    proj, store = _projector(redis_client, settings)
    orphan = RunEvent("orphan", 5, 1, EventType.TOOL_CALLED, 1, stage="draft", call_id="draft/x/0")
    headless = RunEvent("headless", 1, 1, EventType.STAGE_STARTED, 1, stage="draft")
    evs = full_run("gappy", stages=2, calls=1)
    gap = [evs[0], evs[1], evs[3]]  # seq 3 missing
    sources = ["unknown-run", "headless", "seq-gap", "seq-gap", "seq-gap"]
    recs = [RawRecord(src, 0, i, e.run_id.encode(), CODEC.encode(e))
            for i, (src, e) in enumerate(zip(sources, [orphan, headless, *gap], strict=True))]
    res = proj.process(recs)
    o, h, g = (store.load_state(r) for r in ("orphan", "headless", "gappy"))

    def dead(source: str) -> list[DeadLetter]:
        return [d for d in res.dead_letters if d.record.topic == source]

    _observe(dlq, "event for an unknown run (seq > 1)", "unknown-run", dead("unknown-run"),
             _rejection(o, applied_seq=0), rejected=None if o is None else dict(o.rejected))
    workflow = "no_state" if h is None else (
        f"projected_{h.status.value}_{'without' if h.workflow is None else 'with'}_workflow")
    _observe(dlq, "first event not RUN_STARTED", "headless", dead("headless"), workflow,
             last_seq=None if h is None else h.last_seq)
    # an unknown run's event past seq 1: rejected, visible as a rejection, nothing applied
    assert res.rejected == {"seq_gap": 2}
    assert o is not None and o.last_seq == 0 and o.rejected_total == 1 and o.workflow is None
    # a run whose first event is not RUN_STARTED: its seq is held and it shows RUNNING, but it has
    # no workflow, so a resume blocks it ("the run has no RUN_STARTED with a workflow")
    assert h is not None and h.last_seq == 1 and h.workflow is None and h.status is RunStatus.RUNNING
    # a gap: the event after it is rejected until the missing one arrives
    held_back = _rejection(g, applied_seq=2)
    res2 = proj.process([RawRecord("seq-gap", 0, 10, b"gappy", CODEC.encode(evs[2])),
                         RawRecord("seq-gap", 0, 11, b"gappy", CODEC.encode(evs[3]))])
    g2 = store.load_state("gappy")
    filled = g2 is not None and g2.last_seq == 4 and res2.applied == 2
    _observe(dlq, "seq gap", "seq-gap", [*dead("seq-gap"), *res2.dead_letters],
             f"{held_back}_{'until_filled' if filled else 'not_filled'}",
             last_seq_before=None if g is None else g.last_seq,
             last_seq_after=None if g2 is None else g2.last_seq)
    assert g is not None and g.last_seq == 2 and g.rejected_total == 1
    assert filled


def _rejection(state: Any, *, applied_seq: int) -> str:
    """``rejected:<reason>`` when the run's state holds exactly one rejection and stayed at
    ``applied_seq``, else what it shows instead."""
    if state is None:
        return "no_state"
    if state.rejected_total != 1 or state.last_seq != applied_seq:
        return f"last_seq_{state.last_seq}_rejected_{state.rejected_total}"
    return f"rejected:{next(iter(state.rejected))}"


def test_zz_write_bad_input_section(fault_report: Path, dlq: DeadLetterTopic) -> None:
    """The section, from the dead letters read back from the topic and the states the tests saw."""
    back = read_topic(dlq.settings, dlq.topic)
    by_source: dict[str, dict[int, str]] = {}
    for m in back:
        h = parse_headers(m.headers())  # type: ignore[attr-defined]
        # at least once: a dead letter sent again is the same (topic, partition, offset)
        by_source.setdefault(h[H_TOPIC], {})[int(h[H_OFFSET])] = h[H_REASON]
        assert h[H_PARTITION] == "0"
    sent = sum(len(s.sent) for s in _seen)
    assert len(back) >= sent, f"{len(back)} dead letters read back, {sent} sent"
    entries = []
    for s in _seen:
        got = by_source.get(s.source, {})
        reasons = Counter(got.values())
        outcome = ("dead_letter:" + "+".join(sorted(reasons)) if reasons
                   else s.state_outcome or "no_dead_letter")
        checks = {"dead_letters_read_back_as_sent": got == s.sent,
                  "reasons_known": set(reasons) <= REASONS}
        if s.expected_offsets is not None:
            checks["every_bad_record_and_only_those"] = set(got) == s.expected_offsets
            checks["good_runs_projected_whole"] = (s.detail["good_runs_projected_whole"]
                                                   == s.detail["good_runs"])
            outcome = "dead_lettered" if all(checks.values()) else outcome
        else:
            checks["outcome_as_documented"] = outcome == EXPECTED.get(s.point)
        detail = {**s.detail, "dead_letters": len(got), "reasons": dict(sorted(reasons.items()))}
        e = PointEntry(s.point, outcome, checks=checks, detail=detail)
        e.failures = sorted(k for k, v in checks.items() if not v)
        entries.append(e)
    write_section(fault_report, "bad_input", entries)
    assert any(s.expected_offsets is not None for s in _seen), "the fuzz test did not run before the report"
    observed = {e.point: e.outcome for e in entries if e.point in EXPECTED}
    assert observed == EXPECTED, "the defined outcomes are not the documented ones (see the report)"
    failed = [(e.point, e.failures) for e in entries if e.failures]
    assert not failed, failed
