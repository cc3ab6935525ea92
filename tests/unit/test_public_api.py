"""The public names of each package are pinned: changing them is a deliberate act."""

from __future__ import annotations

import importlib

import pytest

PACKAGES = ["runlog", "runlog.schemas", "runlog.producers", "runlog.projections", "runlog.processors"]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_names_exist(name: str) -> None:
    mod = importlib.import_module(name)
    exported = getattr(mod, "__all__", None)
    assert exported is not None, f"{name} has no __all__"
    assert sorted(exported) == sorted(set(exported)), "duplicates in __all__"
    for n in exported:
        assert hasattr(mod, n), f"{name}.{n} is in __all__ but missing"


# The exact public surface of each package: adding or removing a name is a decision, made here.
EXPORTS = {
    "runlog.producers": [
        "App", "ArtifactError", "ArtifactStore", "AsyncChildRun", "AsyncRunner", "AsyncStageContext",
        "Budget", "CallInfo", "CallPosition", "ChildRun", "Cron", "DeliveryError", "DeliveryFn",
        "DictInputSource", "Diverged", "EffectInDoubt", "InputNotFound", "InputSource", "JsonDirInputSource",
        "LeaseLost", "LocalArtifactStore", "Price", "PriceTable", "Queue", "RateLimit", "RateLimited",
        "ReconcileFn",
        "ReplayPolicy",
        "ResumeBlocked", "RetryPolicy", "Schedule",
        "RetryableToolError", "Rule", "RunCancelled", "RunConflict", "RunFailed", "RunHandle", "RunResult",
        "Runner", "RunlogError",
        "Settings", "Stage",
        "StageContext", "StageFn", "TerminalToolError", "Tool", "ToolError", "ToolFn", "Usage",
        "VerificationFailed", "WaitTimedOut", "Workflow", "WorkflowDefinitionError", "WorkflowRegistry",
        "load_args", "rule", "tool",
    ],
    "runlog.schemas": [
        "ArtifactCorrupt", "ArtifactError", "ArtifactMissing", "ArtifactRef", "AuthenticationFailed",
        "Checkpoint", "Codec",
        "ConfigError", "DecodeError", "DeliveryError", "Diverged", "Effect", "EffectInDoubt", "EffectStatus",
        "ErrorInfo", "EventType", "LeaseLost", "LogUnavailable", "RateLimited", "ReplayPolicy",
        "ResumeBlocked",
        "ResumeRequest",
        "RetryableToolError", "RuleResult", "RunCancelled", "RunConflict", "RunFailed", "RunEvent",
        "RunSubmission",
        "RunlogError",
        "SINGLE_OBJECT_MAGIC",
        "SchemaRegistry", "SchemaVersionError", "Settings",
        "StageSpec", "StreamKind", "StreamRecord", "TerminalToolError",
        "ToolError", "TopicConfigConflict",
        "TopicSpec", "Topics", "Usage", "VerificationFailed", "WorkflowDefinitionError", "WorkflowSpec",
        "crc64_avro",
        "event_hash", "load_past_schemas", "load_schema", "murmur2", "now_ms", "partition_for",
    ],
    "runlog.projections": [
        "ApplyResult", "BatchProjector", "BatchResult", "CallRecord", "CallStatus", "CheckpointEntry",
        "DeadLetter", "EffectEntry", "MemoryStore", "Outcome", "OutcomeKind", "Position", "ProjectionLost",
        "ProjectionStore", "ProjectionStoreError", "RawRecord", "RebuildReport", "RedisStore",
        "RejectedEvent", "RunState", "RunStatus", "RunUpdate", "StoredCheckpoint", "apply_script",
        "decode_records",
        "diff_namespaces", "dump_namespace", "event_digest", "fold", "fold_all", "fold_many", "read_run_tail",
        "rebuild", "run_events", "state_from_json", "state_to_json", "swap_namespaces",
    ],
    "runlog.processors": ["main"],
}
# ``import runlog``: the author's surface (the SDK's names), the fleet's client and the version
EXPORTS["runlog"] = [*EXPORTS["runlog.producers"], "Client", "SubmittedRun", "__version__"]


@pytest.mark.parametrize("name", PACKAGES)
def test_the_export_list_is_exactly_the_pinned_one(name: str) -> None:
    mod = importlib.import_module(name)
    assert sorted(mod.__all__) == sorted(EXPORTS[name])


def test_an_author_needs_nothing_private_for_a_workflow_with_a_resumer() -> None:
    import runlog
    import runlog.producers

    needed = {"Workflow", "rule", "tool", "ReplayPolicy", "RetryPolicy", "CallInfo", "Runner", "RunResult",
              "StageContext", "App", "DictInputSource", "Settings", "ToolError", "Diverged", "ResumeBlocked"}
    assert needed <= set(runlog.producers.__all__)
    plumbing = {"RunWriter", "RunSession", "RedisLeaseManager", "LeaseHeld", "canonical_json", "delivery_key"}
    assert not plumbing & set(runlog.producers.__all__)


def test_the_root_is_the_sdk_under_one_name() -> None:
    import runlog
    import runlog.producers

    for name in runlog.producers.__all__:
        assert getattr(runlog, name) is getattr(runlog.producers, name), name
    import runlog.processors.fleet

    assert runlog.Client is runlog.processors.fleet.Client
    assert runlog.SubmittedRun is runlog.processors.fleet.SubmittedRun
    assert runlog.__version__ and runlog.__version__ != "0+unknown"
