"""How a run's state is laid out in its Redis hash (``P:{run}:state``): the fields the apply
script writes, and the state read back from them.

Beside the scalar fields (status, offsets, ...) the hash holds ``snapshot``, the state as JSON
without its calls, and one field per call, ``call:<call id>``, with that call's JSON (``calls``
is ``apart``). A run's calls are most of its state (each holds its tool, key, status, result
reference and verification; a stage of many calls makes a snapshot of tens of kilobytes), and an
update usually changes one or two of them: written apart, an apply sends the snapshot and the
calls that changed (and names the calls that went, dropped at a checkpoint), not the whole state
again. Written whole (a first write, or a writer that does not know the stored calls), the script
drops every call field the update does not set.

A hash written before calls were kept apart (its snapshot holds them, no ``calls`` field) reads
as before; the store writes that run whole next time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runlog.projections._sharded import dumps, index_entry
from runlog.projections._state import (
    CallRecord,
    RunState,
    call_from_json,
    call_to_json,
    checkpoint_to_dict,
    evolve_state,
    state_from_json,
    state_to_dict,
    state_to_json_but_calls,
)
from runlog.projections.store import RunUpdate

__all__ = ["CALLS_APART", "CALL_FIELD", "apply_argv", "run_fields", "state_from_hash"]

CALLS_APART = "apart"
"""The ``calls`` field of a hash whose calls are fields of their own."""
CALL_FIELD = "call:"
"""The prefix of a call's field name (then the call id)."""
_CALL_FIELD_B = CALL_FIELD.encode()
_APART_B = CALLS_APART.encode()


def run_fields(fields: list[str | int], s: RunState,
               base_calls: Mapping[str, CallRecord] | None) -> list[str | int]:
    """Append to ``fields`` (field/value pairs) the snapshot, the marker and the calls to write: those
    that differ from ``base_calls`` (every call when None). Returns the drop list the script takes:
    the count and names of the calls in ``base_calls`` that are gone, or ``[-1]`` (drop every call
    field not set) when ``base_calls`` is None."""
    fields += ["snapshot", state_to_json_but_calls(s), "calls", CALLS_APART]
    calls = s.calls
    if base_calls is None:
        for cid, call in calls.items():
            fields += [CALL_FIELD + cid, call_to_json(call)]
        return [-1]
    for cid, call in calls.items():
        if base_calls.get(cid) is not call:
            fields += [CALL_FIELD + cid, call_to_json(call)]
    gone = [CALL_FIELD + cid for cid in base_calls if cid not in calls]
    return [len(gone), *gone]


def apply_argv(u: RunUpdate, base_calls: Mapping[str, CallRecord] | None) -> list[str | int]:
    """The ARGV of the apply scripts (``lua/apply.lua``, ``lua/cluster_apply.lua``) for ``u`` but its
    last value, the generation: the run's fields (calls written against ``base_calls``,
    :func:`run_fields`), its new checkpoints and its effects."""
    s = u.state
    cp = s.checkpoint
    fields: list[str | int] = [
        "run_id", s.run_id, "status", s.status.value, "stage", s.stage or "",
        "next_stage", s.next_stage or "", "last_seq", s.last_seq, "last_hash", s.last_hash or "",
        "epoch", s.epoch,
        "partition", s.partition, "offset", s.offset, "workflow", s.workflow_name,
        "workflow_version", s.workflow_version, "updated_at", s.updated_at,
        "rejected", s.rejected_total, "checkpoint", cp.checkpoint_id if cp else "",
        "open_effects", len(s.open_effects),
    ]
    dropped = run_fields(fields, s, base_calls)
    argv: list[str | int] = [u.base_offset, s.offset, s.run_id, s.updated_at, len(fields) // 2, *fields,
                             *dropped, len(u.checkpoints)]
    for c in u.checkpoints:
        member = dumps({"checkpoint": checkpoint_to_dict(c.checkpoint), "state": state_to_dict(c.state)})
        argv.extend([c.checkpoint.last_seq, member])
    argv.append(len(u.effects))
    for e in u.effects:
        argv.extend([e.delivery_key, index_entry(e), e.sort_key])
    return argv


def state_from_hash(h: Mapping[bytes, Any]) -> tuple[RunState, bool] | None:
    """The state a run's hash holds (None: no snapshot), and whether its calls were inline in the
    snapshot (the earlier layout)."""
    snap = h.get(b"snapshot")
    if snap is None:
        return None
    st = state_from_json(snap)
    if h.get(b"calls") != _APART_B:
        return st, True
    calls = sorted((call_from_json(v) for k, v in h.items() if k.startswith(_CALL_FIELD_B)),
                   key=lambda c: c.call_id)
    return evolve_state(st, calls={c.call_id: c for c in calls}), False
