"""The key moves of a swap on Redis Cluster (:func:`runlog.projections._swap.swap_namespaces` does the rest:
the refusals, the fence, the catch-up, the marker): one script per slot, all or nothing.

A name (a key with its prefix cut off) lies in the same slot under every prefix, because the
cluster's projection keys carry a hash tag: ``{run}`` for a run's keys, ``{idx:<n>}`` for an index
shard's (:mod:`runlog.projections._sharded`). So the live key, the rebuilt key and the backup key of a name
are one slot's, and so are those of every name whose tag hashes to that slot. Each slot's moves are
one call of ``lua/swap_slot.lua``: it checks, then renames every live key of the slot to the backup
prefix and every rebuilt key into the live namespace, and sets the slot's journal key (under the
backup prefix), or, when a check fails, writes nothing. Its ``back`` form undoes exactly that where
the journal is set, so a roll-back after any failure (a refused slot, a lost reply, a node gone
midway) reads what Redis holds and can be run again. Slots are not atomic together: between two
slots' scripts the live namespace holds some slots' new keys and other slots' old ones, each slot
whole; the namespace marker says ``rebuilding`` all along, so readers that check it do not trust it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import redis
from redis.crc import key_slot

from runlog.projections._namespaces import projection_keys
from runlog.projections._sharded import AfterWrites, ProjectionStoreError, ScriptCall, eval_each, lua
from runlog.schemas.errors import RunlogError

__all__ = [
    "SlotMoves", "SplitName", "check_slots", "move_slots", "roll_back_slots", "slot_moves", "split_names",
]

SOURCE = lua("swap_slot.lua")


@dataclass
class SlotMoves:
    """One slot's names: each with whether the rebuilt namespace has it (it moves in) or only the
    live one does (it moves out, to the backup)."""

    slot: int
    names: list[tuple[bytes, bool]] = field(default_factory=list)

    @property
    def holds_shard(self) -> bool:
        """Whether an index shard's key (``{idx:<n>}:...``) is among the slot's names."""
        return any(n.startswith(b"{idx:") for n, _ in self.names)

    def call(self, mode: str, live: str, rebuilt: str, backup: str) -> ScriptCall:
        """The swap script's KEYS and ARGV for ``mode`` (``in`` or ``back``) on this slot."""
        lp, rp, bp = (p.encode() + b":" for p in (live, rebuilt, backup))
        first = self.names[0][0]
        keys: list[str] = [(bp + first + b":swapped").decode()]
        argv: list[str | int] = [mode]
        for name, incoming in self.names:
            keys += [(lp + name).decode(), (rp + name).decode(), (bp + name).decode()]
            argv.append("1" if incoming else "0")
        return keys, argv


class SplitName(RunlogError):
    """A projection key whose live, rebuilt and backup names are not all in one slot (a key without
    a hash tag, such as an unsharded ``runs:by_status:*``): it cannot be moved atomically."""


def split_names(live: str, rebuilt: str, backup: str, names: list[bytes]) -> list[bytes]:
    """The names among ``names`` whose keys under the three prefixes (and a journal key named after
    them) are not one slot's."""
    lp, rp, bp = (p.encode() + b":" for p in (live, rebuilt, backup))
    return [n for n in names if len({key_slot(lp + n), key_slot(rp + n), key_slot(bp + n),
                                      key_slot(bp + n + b":swapped")}) != 1]


def slot_moves(live: str, rebuilt: str, backup: str, new: list[bytes], old: list[bytes]) -> list[SlotMoves]:
    """The moves of a swap grouped by slot: every name of ``new`` moves in (its live key, if any, to
    the backup), every name of ``old`` only moves out. Raises :class:`SplitName` when a name's keys
    span slots.

    The slots holding an index shard (``{idx:<n>}``) come first, then the others, each part in slot
    order: a swap killed midway then leaves no run's keys newer than its index shards, which is what
    the projectors' in-place rebuild repairs (it rewrites a run's index entries only for the events
    it applies past what the run's keys hold, so a run ahead of its shard would stay mis-indexed)."""
    split = split_names(live, rebuilt, backup, sorted(set(new) | set(old)))
    if split:
        raise SplitName(f"{len(split)} projection keys cannot be moved within one slot, e.g. "
                        f"{split[0].decode()!r} (no hash tag)")
    incoming = set(new)
    by_slot: dict[int, SlotMoves] = {}
    for name in sorted(set(new) | set(old)):
        slot = key_slot(live.encode() + b":" + name)
        by_slot.setdefault(slot, SlotMoves(slot)).names.append((name, name in incoming))
    return sorted(by_slot.values(), key=lambda g: (not g.holds_shard, g.slot))


def check_slots(r: redis.Redis, live: str, rebuilt: str, backup: str) -> list[bytes]:
    """The projection keys of ``live`` and ``rebuilt`` (prefix cut off) that a cluster swap could not
    move within one slot (:func:`split_names`): a swap refuses them before it changes anything."""
    cut_new, cut_old = len(rebuilt.encode()) + 1, len(live.encode()) + 1
    names = {k[cut_new:] for k in projection_keys(r, rebuilt)}
    names |= {k[cut_old:] for k in projection_keys(r, live)}
    return split_names(live, rebuilt, backup, sorted(names))


def move_slots(r: redis.Redis, groups: list[SlotMoves], live: str, rebuilt: str, backup: str, chunk: int,
               hold: Callable[[], None], after: AfterWrites | None = None) -> None:
    """Run the ``in`` form of the swap script on every slot of ``groups``, ``chunk`` slots per
    pipeline, calling ``hold`` after each; any slot refused or failed raises (the others of its
    pipeline ran). ``after``: each pipeline waits for replicas of the nodes it moved keys on
    (:mod:`runlog.projections._replicas`), so a failover cannot undo an acknowledged move."""
    for i in range(0, len(groups), chunk):
        raw = eval_each(r, SOURCE, [g.call("in", live, rebuilt, backup) for g in groups[i:i + chunk]], after)
        bad = [x for x in raw if isinstance(x, Exception)]
        if bad:
            raise ProjectionStoreError(f"{len(bad)} of {len(raw)} slots refused or failed their moves: "
                                       f"{bad[0]}")
        hold()


def roll_back_slots(r: redis.Redis, groups: list[SlotMoves], live: str, rebuilt: str, backup: str,
                    chunk: int, after: AfterWrites | None = None) -> bool:
    """Undo every slot the swap moved (the ``back`` form of the script: only where the slot's
    journal is set). True when every slot answered (and, with ``after``, its replicas)."""
    try:
        for i in range(0, len(groups), chunk):
            raw = eval_each(r, SOURCE, [g.call("back", live, rebuilt, backup) for g in groups[i:i + chunk]],
                            after)
            if any(isinstance(x, Exception) for x in raw):
                return False
    except (redis.RedisError, ProjectionStoreError):
        return False
    return True
