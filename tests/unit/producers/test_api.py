"""The producers package's public names are pinned."""

from __future__ import annotations

import producers


def test_public_api_is_pinned() -> None:
    assert set(producers.__all__) >= {
        "Workflow", "WorkflowRegistry", "rule", "tool", "Tool", "RetryPolicy", "CallInfo",
        "ArtifactStore", "LocalArtifactStore", "InputSource", "DictInputSource", "JsonDirInputSource",
        "PinnedInputs", "RunWriter", "RunSession", "Runner", "RunHandle", "RunResult", "Lease",
        "LeaseManager", "RedisLeaseManager", "LeaseHeld", "delivery_key", "idempotency_key",
        "canonical_json", "STAGE_OUTPUT_MEDIA_TYPE", "StageContext",
    }
