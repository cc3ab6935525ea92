"""What Runlog's own packages use of the SDK beyond its public names: for them, not a stable API.

The writer, sessions, leases, the effects ledger, trace hooks and key helpers, as the processors use
them. An application imports :mod:`runlog.producers` (or :mod:`runlog`) instead.
"""

from runlog.producers.base._envelope import ERASED_TEXT, TEXT_PREFIX, TextSealer, text_sealer
from runlog.producers.base._key_source import key_provider, subject_keys
from runlog.producers.base._keyring import (
    KeyProvider,
    LocalKeyProvider,
    SubjectKeys,
    WrappedKey,
    key_id_of,
)
from runlog.producers.base._trace import NO_TRACE, AttrValue, NoSpan, Span, Tracer, context_of
from runlog.producers.base._transit import TransitKeyProvider
from runlog.producers.calls._artifacts import InMemoryArtifactStore, label
from runlog.producers.calls._call_budget import BudgetGuard
from runlog.producers.calls._calls import WAIT, RecordedCall
from runlog.producers.calls._keys import canonical_json, lp_sha256, sha256_hex
from runlog.producers.calls._ledger import EffectLedger, InMemoryEffectLedger, LedgerEntry, LedgerUnavailable
from runlog.producers.calls._limiter import InMemoryLimiter, Limiter, RedisLimiter
from runlog.producers.calls._replay_hook import EXECUTE, NotReplayed, register, unregister
from runlog.producers.calls._sealed import (
    SealedArtifactStore,
    open_text,
    seal_text,
    sealing,
    store_from_settings,
)
from runlog.producers.calls._throttle import LIMIT, limit_since_key
from runlog.producers.define._inputs import PinnedInputs
from runlog.producers.define._schedule import parse_every
from runlog.producers.log._cloudevents import CloudEventHeaders
from runlog.producers.log._lease import LeaseHeld, RedisLeaseManager, lease_key
from runlog.producers.log._log import DeliveryCallback
from runlog.producers.log._memory import (
    InMemoryEventLog,
    InMemoryLease,
    InMemoryLeaseManager,
    InMemoryLeaseTable,
    LoggedEvent,
)
from runlog.producers.log._runlog import KafkaRunLog
from runlog.producers.log._session import RunSession
from runlog.producers.log._writer import RunWriter, send_resume_request
from runlog.producers.run._active import ActiveRuns
from runlog.producers.run._children import CHILD, child_key, children_ended
from runlog.producers.run._core import waking_parent
from runlog.producers.run._outcome import RunOutcomes
from runlog.producers.run._runs import InMemoryRunKeys, RunKeys, run_id_for_key

__all__ = [
    "CHILD",
    "ERASED_TEXT",
    "EXECUTE",
    "LIMIT",
    "NO_TRACE",
    "TEXT_PREFIX",
    "WAIT",
    "ActiveRuns",
    "AttrValue",
    "BudgetGuard",
    "CloudEventHeaders",
    "DeliveryCallback",
    "EffectLedger",
    "InMemoryArtifactStore",
    "InMemoryEffectLedger",
    "InMemoryEventLog",
    "InMemoryLease",
    "InMemoryLeaseManager",
    "InMemoryLeaseTable",
    "InMemoryLimiter",
    "InMemoryRunKeys",
    "KafkaRunLog",
    "KeyProvider",
    "LeaseHeld",
    "LedgerEntry",
    "LedgerUnavailable",
    "Limiter",
    "LocalKeyProvider",
    "LoggedEvent",
    "NoSpan",
    "NotReplayed",
    "PinnedInputs",
    "RecordedCall",
    "RedisLeaseManager",
    "RedisLimiter",
    "RunKeys",
    "RunOutcomes",
    "RunSession",
    "RunWriter",
    "SealedArtifactStore",
    "Span",
    "SubjectKeys",
    "TextSealer",
    "Tracer",
    "TransitKeyProvider",
    "WrappedKey",
    "canonical_json",
    "child_key",
    "children_ended",
    "context_of",
    "key_id_of",
    "key_provider",
    "label",
    "lease_key",
    "limit_since_key",
    "lp_sha256",
    "open_text",
    "parse_every",
    "register",
    "run_id_for_key",
    "seal_text",
    "sealing",
    "send_resume_request",
    "sha256_hex",
    "store_from_settings",
    "subject_keys",
    "text_sealer",
    "unregister",
    "waking_parent",
]
