"""The public names of ``projections`` that resume and other services build on are pinned."""

from __future__ import annotations

import runlog.projections


def test_projections_public_api_is_pinned() -> None:
    assert set(runlog.projections.__all__) >= {
        "RunState", "RunStatus", "fold", "fold_all", "fold_many", "Outcome", "OutcomeKind",
        "ProjectionStore", "MemoryStore", "RedisStore", "RunUpdate", "ApplyResult", "StoredCheckpoint",
        "EffectEntry", "CallRecord", "BatchProjector", "rebuild", "read_run_tail", "diff_namespaces",
        "swap_namespaces", "state_to_json", "state_from_json",
    }
