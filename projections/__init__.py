"""Redis read models of runs (state, checkpoints, effects ledger), the fold that computes them, rebuild.

The fold, the run state and the store port import no driver: ``import runlog.projections.fold`` loads
neither confluent-kafka, redis nor fastavro. The names that need one (the batch projector, rebuild,
the Redis store) are imported on first use (PEP 562). What Runlog's other packages use beyond these
names is declared in :mod:`runlog.projections.internal` (not a stable API).
"""

import sys
import types
from typing import TYPE_CHECKING, Any

from runlog.projections._state import (
    CallRecord,
    CallStatus,
    CheckpointEntry,
    EffectEntry,
    RejectedEvent,
    RunState,
    RunStatus,
    StoredCheckpoint,
    state_from_json,
    state_to_json,
)
from runlog.projections.fold import (
    Outcome,
    OutcomeKind,
    Position,
    event_digest,
    fold,
    fold_all,
    fold_many,
)
from runlog.projections.store import ApplyResult, MemoryStore, ProjectionStore, RunUpdate
from runlog.schemas.internal import lazy_names

if TYPE_CHECKING:
    from runlog.projections.batch import BatchProjector, BatchResult, DeadLetter, RawRecord, decode_records
    from runlog.projections.rebuild import (
        RebuildReport,
        diff_namespaces,
        dump_namespace,
        read_run_tail,
        rebuild,
        run_events,
        swap_namespaces,
    )
    from runlog.projections.redis_store import ProjectionLost, ProjectionStoreError, RedisStore, apply_script

_LAZY = {
    **dict.fromkeys(("BatchProjector", "BatchResult", "DeadLetter", "RawRecord", "decode_records"),
                    "runlog.projections.batch"),
    **dict.fromkeys(("RebuildReport", "diff_namespaces", "dump_namespace", "read_run_tail", "rebuild",
                     "run_events", "swap_namespaces"), "runlog.projections.rebuild"),
    **dict.fromkeys(("ProjectionLost", "ProjectionStoreError", "RedisStore", "apply_script"),
                    "runlog.projections.redis_store"),
}
"""Exported names whose module imports a driver, by module."""

__getattr__, __dir__ = lazy_names(__name__, _LAZY)


class _Package(types.ModuleType):
    """Keeps ``runlog.projections.rebuild`` the function: importing the submodule of the same name sets
    the package's attribute to the module (the eager import used to rebind it to the function)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "rebuild" and isinstance(value, types.ModuleType):
            value = value.rebuild
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

__all__ = [
    "ApplyResult",
    "BatchProjector",
    "BatchResult",
    "CallRecord",
    "CallStatus",
    "CheckpointEntry",
    "DeadLetter",
    "EffectEntry",
    "MemoryStore",
    "Outcome",
    "OutcomeKind",
    "Position",
    "ProjectionLost",
    "ProjectionStore",
    "ProjectionStoreError",
    "RawRecord",
    "RebuildReport",
    "RedisStore",
    "RejectedEvent",
    "RunState",
    "RunStatus",
    "RunUpdate",
    "StoredCheckpoint",
    "apply_script",
    "decode_records",
    "diff_namespaces",
    "dump_namespace",
    "event_digest",
    "fold",
    "fold_all",
    "fold_many",
    "read_run_tail",
    "rebuild",
    "run_events",
    "state_from_json",
    "state_to_json",
    "swap_namespaces",
]
