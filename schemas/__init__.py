"""Runlog's contract: Avro schemas, the Python types they map to, the codec, topics, settings.

The codec's names are imported on first use (PEP 562), so the types alone load no fastavro. What
Runlog's other packages use beyond these names is declared in :mod:`runlog.schemas.internal` (not a
stable API).
"""

from typing import TYPE_CHECKING

from runlog.schemas._hash import event_hash
from runlog.schemas._lazy import lazy_names
from runlog.schemas._types import (
    ArtifactRef,
    Checkpoint,
    Effect,
    EffectStatus,
    ErrorInfo,
    EventType,
    ReplayPolicy,
    ResumeRequest,
    RuleResult,
    RunEvent,
    RunSubmission,
    StageSpec,
    StreamKind,
    StreamRecord,
    Usage,
    WorkflowSpec,
    now_ms,
)
from runlog.schemas.errors import (
    ArtifactCorrupt,
    ArtifactError,
    ArtifactMissing,
    AuthenticationFailed,
    ConfigError,
    DecodeError,
    DeliveryError,
    Diverged,
    EffectInDoubt,
    LeaseLost,
    LogUnavailable,
    RateLimited,
    ResumeBlocked,
    RetryableToolError,
    RunCancelled,
    RunConflict,
    RunFailed,
    RunlogError,
    SchemaVersionError,
    TerminalToolError,
    ToolError,
    TopicConfigConflict,
    VerificationFailed,
    WorkflowDefinitionError,
)
from runlog.schemas.settings import Settings
from runlog.schemas.topics import Topics, TopicSpec, murmur2, partition_for

if TYPE_CHECKING:
    from runlog.schemas._codec import (
        SINGLE_OBJECT_MAGIC,
        Codec,
        SchemaRegistry,
        crc64_avro,
        load_past_schemas,
        load_schema,
    )

_CODEC = frozenset({"SINGLE_OBJECT_MAGIC", "Codec", "SchemaRegistry", "crc64_avro", "load_past_schemas",
                    "load_schema"})


__getattr__, __dir__ = lazy_names(__name__, dict.fromkeys(_CODEC, "runlog.schemas._codec"))


__all__ = [
    "SINGLE_OBJECT_MAGIC",
    "ArtifactCorrupt",
    "ArtifactError",
    "ArtifactMissing",
    "ArtifactRef",
    "AuthenticationFailed",
    "Checkpoint",
    "Codec",
    "ConfigError",
    "DecodeError",
    "DeliveryError",
    "Diverged",
    "Effect",
    "EffectInDoubt",
    "EffectStatus",
    "ErrorInfo",
    "EventType",
    "LeaseLost",
    "LogUnavailable",
    "RateLimited",
    "ReplayPolicy",
    "ResumeBlocked",
    "ResumeRequest",
    "RetryableToolError",
    "RuleResult",
    "RunCancelled",
    "RunConflict",
    "RunEvent",
    "RunFailed",
    "RunSubmission",
    "RunlogError",
    "SchemaRegistry",
    "SchemaVersionError",
    "Settings",
    "StageSpec",
    "StreamKind",
    "StreamRecord",
    "TerminalToolError",
    "ToolError",
    "TopicConfigConflict",
    "TopicSpec",
    "Topics",
    "Usage",
    "VerificationFailed",
    "WorkflowDefinitionError",
    "WorkflowSpec",
    "crc64_avro",
    "event_hash",
    "load_past_schemas",
    "load_schema",
    "murmur2",
    "now_ms",
    "partition_for",
]
