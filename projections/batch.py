"""Project a batch of raw event records: decode, fold per run (LRU-cached states), write the store.

Delivery: the input is at-least-once (a record may come again after a crash);
the fold's position guard and the store's offset compare-and-set make a
repeated record change nothing, so the outputs (checkpoints, effects) of a
record are produced at least once and identical each time.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from runlog.projections._fold_outcome import LimitUse
from runlog.projections._state import EffectEntry, RunState, StoredCheckpoint
from runlog.projections.fold import Outcome, OutcomeKind, Position, fold
from runlog.projections.store import ApplyResult, ProjectionStore, RunUpdate, StoreWentBack
from runlog.schemas import Checkpoint, Codec, RunEvent, Usage, event_hash
from runlog.schemas.errors import DecodeError, RunlogError

__all__ = ["BatchProjector", "BatchResult", "DeadLetter", "RawRecord", "Received", "decode_records"]

MAX_ATTEMPTS = 5

Received = tuple[RunEvent, Position, str]
"""A decoded event, its record's position and its hash computed from the record's bytes as read
(``runlog.schemas.event_hash(event, body)``: the body as received for a version-2 event, never a
re-encoding), which the fold takes as the event's ``content_hash``."""


Heal = Callable[[str, int, int], list[Received]]
"""(run id, partition, from offset) -> the run's events in its partition from that offset on, in log
order: what a run whose projected state has a seq gap is re-folded from (:class:`BatchProjector`)."""

HEALED_MEMORY = 10_000
"""How many (run, offset) heals a projector remembers, so a run whose log really has a gap is read
once per state, not once per batch."""

Publish = Callable[[list[Checkpoint], list[EffectEntry]], None]
"""Publishes a batch's checkpoints and effects and returns once they are acknowledged."""


@dataclass(frozen=True, slots=True)
class RawRecord:
    """A record as read from the events topic."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record that is not a valid event of this topic, and why."""

    record: RawRecord
    reason: str
    detail: str


@dataclass
class BatchResult:
    """What one batch did; ``checkpoints`` and ``effects`` are to be published, in order."""

    outcomes: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    checkpoints: list[Checkpoint] = field(default_factory=list)
    effects: list[EffectEntry] = field(default_factory=list)
    conflicts: int = 0
    usage: list[tuple[str, Usage]] = field(default_factory=list)
    """(workflow name, usage) of each accepted ``TOOL_RESULT`` that recorded usage, once per event
    applied (a redelivered or retried batch folds to duplicates and adds nothing)."""
    limits: list[LimitUse] = field(default_factory=list)
    """What each accepted event said of a call's rate limit (a ``TOOL_RESULT`` of a metered call, a
    durable wait beginning), once per event applied like :attr:`usage`."""

    @property
    def applied(self) -> int:
        return self.outcomes[OutcomeKind.ACCEPTED.value]


def decode_records(
    codec: Codec, records: Sequence[RawRecord]
) -> tuple[list[Received], list[DeadLetter]]:
    """Decode records into events with their positions and hashes (:data:`Received`); the rest
    become dead letters."""
    good: list[Received] = []
    dead: list[DeadLetter] = []
    for r in records:
        if r.value is None:
            dead.append(DeadLetter(r, "truncated", "record has no value"))
            continue
        try:
            ev, body = codec.decode_with_body(r.value, RunEvent)
        except DecodeError as err:
            dead.append(DeadLetter(r, err.reason, err.detail))
            continue
        if r.key is not None and r.key != ev.run_id.encode("utf-8"):
            dead.append(DeadLetter(r, "key_mismatch", f"key {r.key[:64]!r} is not run id {ev.run_id!r}"))
            continue
        good.append((ev, (r.partition, r.offset), event_hash(ev, body)))
    return good, dead


@dataclass
class _Folded:
    base: RunState | None
    state: RunState | None
    outcomes: list[Outcome]
    checkpoints: list[StoredCheckpoint]


def _fold_run(base: RunState | None, items: list[Received]) -> _Folded:
    state = base
    outcomes: list[Outcome] = []
    cps: list[StoredCheckpoint] = []
    for ev, pos, h in items:
        state, out = fold(state, ev, pos, content_hash=h)
        outcomes.append(out)
        if out.checkpoint is not None:
            cps.append(StoredCheckpoint(out.checkpoint, state))
    return _Folded(base, state, outcomes, cps)


class BatchProjector:
    """Folds batches of records into a :class:`ProjectionStore`, caching run states (LRU).

    ``heal``, when given, is the second line of defence against events skipped on the way in
    (the first is the projector's offset guard): a run with a projected state whose batch brings
    an event beyond its next seq (``seq_gap``) is re-read from its partition, from just after its
    state's offset, and folded again from that state before anything is written, so the events
    the run missed are applied instead of every later one being rejected for good. A run with no
    projected state is not healed (its start is unknown without reading the whole partition), and
    a gap that is really in the log is read once per state and rejected as before.
    """

    def __init__(self, store: ProjectionStore, codec: Codec, *, cache_size: int = 10_000,
                 heal: Heal | None = None) -> None:
        self.store = store
        self.codec = codec
        self.cache_size = cache_size
        self.heal = heal
        self.heals = 0
        """Runs re-folded from their partition because of a seq gap."""
        self._cache: OrderedDict[str, RunState] = OrderedDict()
        self._healed: OrderedDict[tuple[str, int], None] = OrderedDict()

    def forget(self, run_ids: Sequence[str] | None = None) -> None:
        """Drop cached states (all when ``run_ids`` is None), e.g. after a rebalance."""
        if run_ids is None:
            self._cache.clear()
        else:
            for r in run_ids:
                self._cache.pop(r, None)

    def _remember(self, state: RunState) -> None:
        self._cache[state.run_id] = state
        self._cache.move_to_end(state.run_id)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def process(self, records: Sequence[RawRecord], publish: Publish | None = None) -> BatchResult:
        events, dead = decode_records(self.codec, records)
        result = self.process_events(events, publish)
        result.dead_letters.extend(dead)
        return result

    def process_events(self, events: Sequence[Received], publish: Publish | None = None) -> BatchResult:
        """Fold decoded events (:func:`decode_records`) into the store.

        ``publish``, when given, receives the checkpoints and effects of every update before the
        store applies it, and must have them acknowledged when it returns: a crash after the apply
        then finds them published already (a redelivered batch folds to duplicates and publishes
        nothing), and a crash before it publishes them again, identical (they are a function of
        the log). They are also in the result, as without ``publish``."""
        result = BatchResult()
        by_run: dict[str, list[Received]] = {}
        for item in events:
            by_run.setdefault(item[0].run_id, []).append(item)
        pending = list(by_run)
        bases: dict[str, RunState | None] = {r: self._cache.get(r) for r in pending}
        stored = self.store.load_states([r for r in pending if bases[r] is None])
        bases.update(stored)
        for attempt in range(MAX_ATTEMPTS):
            folded = {r: _fold_run(bases.get(r), by_run[r]) for r in pending}
            if self.heal is not None and attempt == 0:
                self._heal_gaps(folded, by_run)
            writes = [(r, f) for r, f in folded.items() if f.state is not None and f.state is not f.base]
            refresh = _refreshes(folded, stored)
            updates = [
                RunUpdate(
                    state=f.state,
                    base_offset=f.base.offset if f.base is not None else -1,
                    base_status=f.base.status if f.base is not None else None,
                    checkpoints=tuple(f.checkpoints),
                    effects=_last_per_key(f.outcomes),
                    base_calls=f.base.calls if f.base is not None else None,
                )
                for _, f in writes
                if f.state is not None
            ]
            if publish is not None and updates:
                cps = [c.checkpoint for _, f in writes for c in f.checkpoints]
                effs = [e for _, f in writes for out in f.outcomes for e in out.effects]
                if cps or effs:
                    publish(cps, effs)
            applied = self.store.apply([*updates, *refresh])
            results = dict(zip([r for r, _ in writes], applied[:len(updates)], strict=True))
            retry = [r for r, res in results.items() if res is not ApplyResult.APPLIED]
            for r, f in folded.items():
                if r in retry:
                    continue
                if f.state is not None:
                    self._remember(f.state)
                for out in f.outcomes:
                    result.outcomes[out.kind.value] += 1
                    if out.rejected and out.reason:
                        result.rejected[out.reason] += 1
                    result.effects.extend(out.effects)
                    if out.usage is not None and f.state is not None:
                        result.usage.append((f.state.workflow_name, out.usage))
                    if out.limit is not None:
                        result.limits.append(out.limit)
                result.checkpoints.extend(c.checkpoint for c in f.checkpoints)
            if not retry:
                return result
            # Computed from a stale base (another worker moved the run): re-fold from the store.
            result.conflicts += len(retry)
            self.forget(retry)
            fresh = self.store.load_states(retry)
            behind = [r for r in retry if _went_back(bases.get(r), fresh.get(r))]
            if behind:
                raise StoreWentBack(behind)
            bases = {r: fresh.get(r) for r in retry}
            stored = fresh
            pending = retry
        raise RunlogError(f"runs {pending[:5]} kept conflicting after {MAX_ATTEMPTS} attempts")


    def _heal_gaps(self, folded: dict[str, _Folded], by_run: dict[str, list[Received]]) -> None:
        assert self.heal is not None
        for r, f in folded.items():
            base = f.base
            if base is None or base.offset < 0 or base.partition < 0:
                continue
            if not any(o.reason == "seq_gap" for o in f.outcomes):
                continue
            key = (r, base.offset)
            if key in self._healed:
                continue
            self._healed[key] = None
            while len(self._healed) > HEALED_MEMORY:
                self._healed.popitem(last=False)
            items = self.heal(r, base.partition, base.offset + 1)
            if not items:
                continue
            self.heals += 1
            by_run[r] = items
            folded[r] = _fold_run(base, items)


def _refreshes(folded: dict[str, _Folded], stored: dict[str, RunState]) -> list[RunUpdate]:
    """Updates that rewrite nothing but the indexes, for the runs whose stored state already held
    every event of the batch (a redelivery): on Redis Cluster an apply is two steps (the run's
    slot, then the index shards, :mod:`runlog.projections._sharded`), and a projector that died between
    them left the run's state stored and its index entries not; the fold of the redelivered batch
    finds only duplicates, so without these nothing would ever write them. The store answers
    ALREADY to the run's own write (its offset is the stored one) and rewrites the run's status
    and effects in the indexes, which are idempotent; a single-step store writes nothing."""
    out = []
    for r, f in folded.items():
        base = stored.get(r)
        if base is not None and f.base is base and f.state is base:
            effects = {**base.closed_effects, **base.open_effects}
            out.append(RunUpdate(state=base, base_offset=base.offset, base_status=base.status,
                                 effects=tuple(effects.values()), base_calls=base.calls))
    return out


def _went_back(base: RunState | None, stored: RunState | None) -> bool:
    """Whether the store now holds an older state of the run than ``base``, a state that was
    applied there (by this writer, or read from the store): writers only move runs forward."""
    if base is None or base.offset < 0:
        return False
    return stored is None or stored.offset < base.offset


def _last_per_key(outcomes: list[Outcome]) -> tuple[EffectEntry, ...]:
    last: dict[str, EffectEntry] = {}
    for out in outcomes:
        for e in out.effects:
            last[e.delivery_key] = e
    return tuple(last.values())
