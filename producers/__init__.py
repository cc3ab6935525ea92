"""The agent-side SDK: workflows, tools with replay policies, artifacts, the lease, the run writer.

Delivery semantics: events are produced by one idempotent, ``acks=all`` producer
per process, keyed by run id; effect intents are confirmed before the effect,
everything else is confirmed at each stage end (see :mod:`producers._writer`).
"""

from producers._artifacts import ArtifactStore, LocalArtifactStore
from producers._context import JSON, StageContext, StageOutputs, error_info
from producers._crash import crash_point, event_subject
from producers._inputs import DictInputSource, InputNotFound, InputSource, JsonDirInputSource, PinnedInputs
from producers._keys import canonical_json, delivery_key, idempotency_key, lp_sha256, sha256_hex
from producers._lease import Lease, LeaseHeld, LeaseManager, RedisLease, RedisLeaseManager
from producers._runner import STAGE_OUTPUT_MEDIA_TYPE, RunHandle, Runner, RunResult
from producers._runs import RunKeys
from producers._session import AppendResult, RunSession
from producers._tools import (
    CallInfo,
    DeliveryFn,
    ReconcileFn,
    RetryPolicy,
    Tool,
    ToolFn,
    call_with_retry,
    tool,
)
from producers._workflow import Rule, Stage, StageFn, Workflow, WorkflowRegistry, evaluate_rules, rule
from producers._writer import RunWriter

__all__ = [
    "JSON",
    "STAGE_OUTPUT_MEDIA_TYPE",
    "AppendResult",
    "ArtifactStore",
    "CallInfo",
    "DeliveryFn",
    "DictInputSource",
    "InputNotFound",
    "InputSource",
    "JsonDirInputSource",
    "Lease",
    "LeaseHeld",
    "LeaseManager",
    "LocalArtifactStore",
    "PinnedInputs",
    "ReconcileFn",
    "RedisLease",
    "RedisLeaseManager",
    "RetryPolicy",
    "Rule",
    "RunHandle",
    "RunKeys",
    "RunResult",
    "RunSession",
    "RunWriter",
    "Runner",
    "Stage",
    "StageContext",
    "StageFn",
    "StageOutputs",
    "Tool",
    "ToolFn",
    "Workflow",
    "WorkflowRegistry",
    "call_with_retry",
    "canonical_json",
    "crash_point",
    "delivery_key",
    "error_info",
    "evaluate_rules",
    "event_subject",
    "idempotency_key",
    "lp_sha256",
    "rule",
    "sha256_hex",
    "tool",
]
