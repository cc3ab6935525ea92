"""``event_hash`` gives the very bytes the reference canonical JSON gives, for many random events.

The hash chain is a contract (``prev_hash`` of stored events must keep verifying), so the fast path
in ``schemas/_hash.py`` is compared here with a plain reference implementation of the documented
canonical form (every field that differs from its default, keys sorted, nested records the same
way, enums by value, maps sorted by key), and with a digest of hashes computed before the fast
path existed. That is hash version 1 (``hash_version`` at its default, 1: every event written before
version 2). Version 2 (the sha256 of the record's Avro body) is compared with the codec's bytes.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping
from dataclasses import MISSING, fields, replace
from enum import Enum
from typing import Any

from runlog.processors.bench._events import history
from runlog.schemas import (
    ArtifactRef,
    Codec,
    ErrorInfo,
    EventType,
    RunEvent,
    StageSpec,
    Usage,
    WorkflowSpec,
    event_hash,
)
from runlog.schemas._hash import _canon
from runlog.schemas._types import ReplayPolicy, RuleResult


def _ref_canon(v: Any) -> Any:
    if isinstance(v, Enum):
        return v.value
    if hasattr(type(v), "__dataclass_fields__"):
        return _ref_record(v)
    if isinstance(v, Mapping):
        return {str(a): _ref_canon(x) for a, x in sorted(v.items())}
    if isinstance(v, tuple | list):
        return [_ref_canon(x) for x in v]
    return v


def _ref_record(v: Any) -> dict[str, Any]:
    out = {}
    for f in fields(v):
        if f.default is not MISSING:
            d = _ref_canon(f.default)
        elif f.default_factory is not MISSING:
            d = _ref_canon(f.default_factory())
        else:
            d = MISSING
        x = getattr(v, f.name)
        c = None if x is None else _ref_canon(x)
        if d is not MISSING and c == d:
            continue
        out[f.name] = c
    return out


def reference_hash(ev: RunEvent) -> str:
    text = json.dumps(_ref_record(ev), separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


_ALPHABET = "abcXYZ09 _-/:.\"\\\n\t\x00\x1f\x7f\u00e9\u2028\u4e2d\U0001f600"


def _s(rng: random.Random, empty: bool = True) -> str:
    return "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0 if empty else 1, 12)))


def _opt(rng: random.Random, make: Any) -> Any:
    return None if rng.random() < 0.4 else make()


def _int(rng: random.Random) -> int:
    return rng.choice([0, 1, -1, 2**31, -(2**63), 2**64 + 3, rng.randint(-10**6, 10**15)])


def _art(rng: random.Random) -> ArtifactRef:
    media = rng.choice(["application/octet-stream", "application/json", "", _s(rng)])
    return ArtifactRef(_s(rng), _s(rng), _int(rng), media)


def _map(rng: random.Random) -> dict[str, str]:
    return {_s(rng): _s(rng) for _ in range(rng.choice([0, 0, 1, 3]))}


GOLDEN_TYPES = [t for t in EventType if t is not EventType.RUN_UPGRADED]
"""The event types when the golden digest was computed (the random sequence draws from them; types
added later are appended to the enum and hashed in the reference test below)."""


def random_event(rng: random.Random) -> RunEvent:
    wf = WorkflowSpec(_s(rng), _s(rng), tuple(
        StageSpec(_s(rng), tuple(_s(rng) for _ in range(rng.randint(0, 2))),
                  tuple(_s(rng) for _ in range(rng.randint(0, 2))), rng.random() < 0.5)
        for _ in range(rng.randint(0, 3))))
    return RunEvent(
        run_id=_s(rng, empty=False),
        seq=_int(rng),
        epoch=rng.choice([0, 1, 7, False, True]),
        type=rng.choice(GOLDEN_TYPES),
        occurred_at=_int(rng),
        stage=_opt(rng, lambda: _s(rng)),
        workflow=_opt(rng, lambda: wf),
        input_versions=_map(rng),
        payload_ref=_opt(rng, lambda: _art(rng)),
        artifact_refs=tuple(_art(rng) for _ in range(rng.choice([0, 0, 1, 2]))),
        tool=_opt(rng, lambda: _s(rng)),
        call_id=_opt(rng, lambda: _s(rng)),
        replay_policy=_opt(rng, lambda: rng.choice(list(ReplayPolicy))),
        idempotency_key=_opt(rng, lambda: _s(rng)),
        delivery_key=_opt(rng, lambda: _s(rng)),
        target=_opt(rng, lambda: _s(rng)),
        request_hash=_opt(rng, lambda: _s(rng)),
        external_id=_opt(rng, lambda: _s(rng)),
        verification=tuple(RuleResult(_s(rng), rng.random() < 0.5, _opt(rng, lambda: _s(rng)))
                           for _ in range(rng.choice([0, 0, 1, 2]))),
        error=_opt(rng, lambda: ErrorInfo(_s(rng), _s(rng), rng.choice([False, True, 0, 1]))),  # type: ignore[arg-type]
        parent_run_id=_opt(rng, lambda: _s(rng)),
        forked_from_seq=_opt(rng, lambda: _int(rng)),
        attributes=_map(rng),
        prev_hash=_opt(rng, lambda: hashlib.sha256(_s(rng).encode()).hexdigest()),
    )


def test_event_hash_equals_the_reference_over_random_events() -> None:
    rng = random.Random(17)
    for i in range(5000):
        ev = random_event(rng)
        assert event_hash(ev) == reference_hash(ev), (i, ev)
        upgraded = replace(ev, type=EventType.RUN_UPGRADED)
        assert event_hash(upgraded) == reference_hash(upgraded), (i, upgraded)
        spent = replace(ev, usage=Usage(_s(rng, empty=False), _int(rng), _int(rng), rng.choice([0, 5]), 0,
                                        _opt(rng, lambda: _int(rng))))
        assert event_hash(spent) == reference_hash(spent), (i, spent)


def test_event_hash_of_bench_histories_equals_the_reference() -> None:
    for r in range(3):
        for ev in history(f"run-{r}", 1, 230):
            v1 = replace(ev, hash_version=1)
            assert event_hash(v1) == reference_hash(v1)


def test_random_event_hashes_are_the_ones_computed_before_the_fast_path() -> None:
    """A digest of 2,000 random events' hashes, computed with the implementation the chain was
    first written with: the hashes of stored events never change."""
    rng = random.Random(2026)
    acc = hashlib.sha256()
    for _ in range(2000):
        acc.update(event_hash(random_event(rng)).encode())
    assert acc.hexdigest() == GOLDEN


def test_version_2_is_the_sha256_of_the_codecs_body_over_random_events() -> None:
    """Without bytes, version 2 encodes with the current schema: the body the codec writes, so the
    hash a writer computes from its bytes and the one computed from the event agree."""
    rng = random.Random(5)
    codec, n = Codec(), 0
    for _ in range(1000):
        ev = replace(random_event(rng), hash_version=2)
        try:
            data = codec.encode(ev)
        except Exception:  # noqa: BLE001 - values the random generator makes that Avro refuses
            continue
        n += 1
        decoded, body = codec.decode_with_body(data, RunEvent)
        assert body == data[10:]
        assert event_hash(ev) == event_hash(decoded, body) == hashlib.sha256(data[10:]).hexdigest()
        v1 = replace(ev, hash_version=1)
        assert event_hash(v1) == reference_hash(v1) != event_hash(ev)  # version 1: as before
    assert n > 300
    for ev in history("run-v2", 1, 230):  # the bench's events, all encodable
        ev2 = replace(ev, hash_version=2)
        assert event_hash(ev2) == hashlib.sha256(codec.encode(ev2)[10:]).hexdigest()


def test_none_in_a_field_without_a_none_default_is_null() -> None:
    ev = RunEvent("r", 1, 1, EventType.RUN_STARTED, 5, input_versions=None)  # type: ignore[arg-type]
    assert event_hash(ev) == reference_hash(ev)
    assert _canon(ev)["input_versions"] is None


GOLDEN = "7a8e20cb99fc066cdb3a906750cb8e6e5f04400b2a939f03e5734b44d5ad7f33"
