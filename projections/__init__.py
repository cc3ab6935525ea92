"""Redis read models of runs (state, checkpoints, effects ledger), the fold that computes them, rebuild."""

from projections._state import (
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
from projections.batch import BatchProjector, BatchResult, DeadLetter, RawRecord, decode_records
from projections.fold import (
    Outcome,
    OutcomeKind,
    Position,
    event_digest,
    fold,
    fold_all,
    fold_many,
)
from projections.rebuild import (
    RebuildReport,
    diff_namespaces,
    dump_namespace,
    read_run_tail,
    rebuild,
    run_events,
    swap_namespaces,
)
from projections.redis_store import ProjectionStoreError, RedisStore, apply_script
from projections.store import ApplyResult, MemoryStore, ProjectionStore, RunUpdate

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
