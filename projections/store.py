"""The projection store port (read models of runs, checkpoints, effects) and its in-memory adapter.

Every write is a :class:`RunUpdate`: the run's new state plus what it produced,
computed from a base state whose log offset the update names. A store applies
an update atomically and only when its stored offset still equals that base
(compare-and-set): an update already applied (stored offset >= new offset)
changes nothing, so at-least-once delivery is enough; an update computed from a
stale base is refused as a conflict, and the caller re-folds from the store.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from runlog.projections._state import CallRecord, EffectEntry, RunState, RunStatus, StoredCheckpoint
from runlog.schemas.errors import RunlogError

__all__ = ["ApplyResult", "MemoryStore", "ProjectionStore", "RunUpdate", "StoreWentBack"]


class StoreWentBack(RunlogError):
    """The store holds an older state of a run than one this writer applied there: writes the store
    acknowledged are gone (a Redis failover to a replica that had not received them, a restore
    from an older snapshot). No writer moves a run back, so the namespace cannot be trusted: it
    must be rebuilt from the log (the projector drops the namespace marker and recovers)."""

    def __init__(self, run_ids: Sequence[str]) -> None:
        super().__init__(f"the projection went back for runs {list(run_ids)[:5]}: acknowledged writes "
                         "are gone from Redis; the namespace is rebuilt from the log")
        self.run_ids = tuple(run_ids)


class ApplyResult(StrEnum):
    APPLIED = "applied"
    ALREADY = "already"
    """The store is at or past this update's offset: nothing changed."""
    CONFLICT = "conflict"
    """The store's offset is not the update's base: re-fold from the stored state."""


@dataclass(frozen=True, slots=True)
class RunUpdate:
    """One atomic write of a run: ``state`` folded from the stored state at ``base_offset``."""

    state: RunState
    base_offset: int = -1
    base_status: RunStatus | None = None
    checkpoints: tuple[StoredCheckpoint, ...] = ()
    effects: tuple[EffectEntry, ...] = ()
    base_calls: Mapping[str, CallRecord] | None = None
    """The calls of the state at ``base_offset`` (the fold's base), when the writer knows them: a
    store that keeps each call apart (Redis: one hash field per call) then writes only the calls
    that changed and drops the ones gone. None: every call is written, and any other dropped."""

    @property
    def run_id(self) -> str:
        return self.state.run_id


class ProjectionStore(Protocol):
    """Read models of runs: state snapshots, ordered checkpoints, the effects ledger, indexes."""

    def load_state(self, run_id: str) -> RunState | None:
        """The run's latest projected state, or None when the store has never seen it."""
        ...

    def load_states(self, run_ids: Iterable[str]) -> dict[str, RunState]:
        """Many runs' states in one round trip (missing runs are left out)."""
        ...

    def checkpoints(self, run_id: str, *, last: int | None = None) -> list[StoredCheckpoint]:
        """The run's checkpoints with their state snapshots, oldest first (only the newest
        ``last`` of them when given)."""
        ...

    def effects(self, run_id: str) -> dict[str, EffectEntry]:
        """The run's effects ledger by delivery key."""
        ...

    def effect(self, delivery_key: str) -> EffectEntry | None:
        """The ledger entry of a delivery key, whatever run it belongs to."""
        ...

    def runs(self, status: RunStatus | None = None) -> list[str]:
        """Run ids, by last update time, optionally only those with a status."""
        ...

    def apply(self, updates: Sequence[RunUpdate]) -> list[ApplyResult]:
        """Apply updates (each atomically and guarded, see the module docstring), in order."""
        ...


class MemoryStore:
    """A :class:`ProjectionStore` in dicts, for unit tests."""

    def __init__(self) -> None:
        self._states: dict[str, RunState] = {}
        self._checkpoints: dict[str, dict[int, StoredCheckpoint]] = {}
        self._effects: dict[str, dict[str, EffectEntry]] = {}
        self._by_key: dict[str, EffectEntry] = {}
        self._by_status: dict[RunStatus, dict[str, int]] = {}

    def load_state(self, run_id: str) -> RunState | None:
        return self._states.get(run_id)

    def load_states(self, run_ids: Iterable[str]) -> dict[str, RunState]:
        return {r: self._states[r] for r in run_ids if r in self._states}

    def checkpoints(self, run_id: str, *, last: int | None = None) -> list[StoredCheckpoint]:
        cps = self._checkpoints.get(run_id, {})
        out = [cps[k] for k in sorted(cps)]
        return out if last is None else out[-max(last, 1):]

    def effects(self, run_id: str) -> dict[str, EffectEntry]:
        return dict(self._effects.get(run_id, {}))

    def effect(self, delivery_key: str) -> EffectEntry | None:
        return self._by_key.get(delivery_key)

    def runs(self, status: RunStatus | None = None) -> list[str]:
        pools: Mapping[RunStatus, dict[str, int]] = (
            self._by_status if status is None else {status: self._by_status.get(status, {})}
        )
        scored = [(t, r) for pool in pools.values() for r, t in pool.items()]
        return [r for _, r in sorted(scored)]

    def apply(self, updates: Sequence[RunUpdate]) -> list[ApplyResult]:
        return [self._apply_one(u) for u in updates]

    def _apply_one(self, u: RunUpdate) -> ApplyResult:
        cur = self._states.get(u.run_id)
        cur_off = cur.offset if cur is not None else -1
        if cur_off >= u.state.offset:
            return ApplyResult.ALREADY
        if cur_off != u.base_offset:
            return ApplyResult.CONFLICT
        if cur is not None:
            self._by_status.get(cur.status, {}).pop(u.run_id, None)
        self._states[u.run_id] = u.state
        self._by_status.setdefault(u.state.status, {})[u.run_id] = u.state.updated_at
        cps = self._checkpoints.setdefault(u.run_id, {})
        for c in u.checkpoints:
            cps[c.checkpoint.last_seq] = c
        led = self._effects.setdefault(u.run_id, {})
        for e in u.effects:
            led[e.delivery_key] = e
            held = self._by_key.get(e.delivery_key)
            if held is None or e.sort_key <= held.sort_key:  # done beats open, then the earliest opened
                self._by_key[e.delivery_key] = e
        return ApplyResult.APPLIED
