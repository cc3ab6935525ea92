"""Runlog's exception tree: one root, a few meaningful children with structured fields.

::

    RunlogError
    ├── ConfigError                 bad or missing configuration
    │   └── TopicConfigConflict     an existing topic differs from what Runlog needs
    ├── DecodeError                 bytes that are not a Runlog record (reason says which)
    ├── DeliveryError               the broker did not acknowledge an append
    ├── LogUnavailable              the log could not be read for now (brokers unreachable)
    ├── AuthenticationFailed        the Kafka broker refused the client's credentials
    ├── LeaseLost                   this writer no longer holds the run's lease
    ├── ArtifactError               artifact store problems
    │   ├── ArtifactMissing
    │   ├── ArtifactCorrupt         stored bytes do not hash to their name
    │   └── PayloadKeyError         an encrypted payload's data key cannot be had
    │       └── SubjectErased       its subject was erased (``runlog erase``): the payload is gone
    ├── WorkflowDefinitionError     a workflow or tool declared wrongly
    ├── RunConflict                 a run idempotency key reused with other parameters
    ├── RunFailed                   an awaited run ended FAILED
    ├── RunCancelled                an awaited run was cancelled
    ├── ToolError                   a tool call failed
    │   ├── RetryableToolError
    │   └── TerminalToolError
    ├── VerificationFailed          a stage's rules did not all pass
    └── ResumeBlocked               a run cannot go on without a person
        ├── Diverged                a resumed call differs from the recorded one
        └── EffectInDoubt           an effect's delivery key is open in another run

Driver errors (confluent-kafka, redis, fastavro) are translated at the adapter
with ``raise ... from err`` so the cause stays attached.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = [
    "ArtifactCorrupt",
    "ArtifactError",
    "ArtifactMissing",
    "AuthenticationFailed",
    "ConfigError",
    "DecodeError",
    "DeliveryError",
    "Diverged",
    "EffectInDoubt",
    "LeaseLost",
    "LogUnavailable",
    "PayloadKeyError",
    "RateLimited",
    "ResumeBlocked",
    "RetryableToolError",
    "RunCancelled",
    "RunConflict",
    "RunFailed",
    "RunlogError",
    "SchemaVersionError",
    "SubjectErased",
    "TerminalToolError",
    "ToolError",
    "TopicConfigConflict",
    "VerificationFailed",
    "WorkflowDefinitionError",
]


class RunlogError(Exception):
    """Root of every error Runlog raises on purpose."""


class ConfigError(RunlogError):
    """Configuration is missing or malformed."""


class AuthenticationFailed(RunlogError):
    """The Kafka broker refused the client: its credentials (SASL), its TLS handshake, or (``kind``
    "authorization") what the authenticated principal may do.

    The message is one line naming the failure, the broker, the protocol, mechanism and user; never
    the password.

    Attributes:
        broker: the bootstrap servers asked.
        protocol: ``security.protocol`` (``PLAINTEXT`` when unset).
        mechanism: ``sasl.mechanism`` (empty without SASL).
        user: ``sasl.username`` (empty when there is none).
        detail: the client's own reason (librdkafka's or aiokafka's text).
        kind: ``authentication`` or ``authorization``.
    """

    def __init__(self, broker: str, detail: str, *, protocol: str = "PLAINTEXT", mechanism: str = "",
                 user: str = "", kind: str = "authentication") -> None:
        self.broker, self.detail, self.kind = broker, detail, kind
        self.protocol, self.mechanism, self.user = protocol, mechanism, user
        who = " ".join(x for x in (protocol, mechanism, f"user {user!r}" if user else "") if x)
        super().__init__(f"{kind} failed: Kafka at {broker} refused {who}: {detail}")


class TopicConfigConflict(ConfigError):
    """An existing topic's setting differs from what Runlog requires."""

    def __init__(self, topic: str, setting: str, expected: str, actual: str) -> None:
        self.topic = topic
        self.setting = setting
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"topic {topic!r}: {setting} is {actual!r}, Runlog needs {expected!r}"
        )


class DecodeError(RunlogError):
    """Bytes that cannot be decoded into a Runlog record.

    Attributes:
        reason: one of ``unknown_framing``, ``unknown_schema``, ``truncated``,
            ``invalid_body``, ``wrong_type``, ``oversized``.
        detail: human-readable explanation.
    """

    REASONS = frozenset(
        {"unknown_framing", "unknown_schema", "truncated", "invalid_body", "wrong_type", "oversized"}
    )

    def __init__(self, reason: str, detail: str) -> None:
        if reason not in self.REASONS:
            raise ValueError(f"unknown DecodeError reason {reason!r}")
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


class SchemaVersionError(ConfigError):
    """A record uses something newer than the schema version writers are pinned to
    (``RUNLOG_SCHEMA_VERSION``): an event type or enum symbol, or a field, that version lacks. It is
    written once every member of the fleet reads a newer version and the pin is raised.

    Attributes:
        version: the pinned version.
        feature: what the record uses (``"event type RUN_UPGRADED"``).
    """

    def __init__(self, version: int, feature: str, record: str) -> None:
        self.version = version
        self.feature = feature
        super().__init__(
            f"{record}: {feature} is newer than schema version {version}, which RUNLOG_SCHEMA_VERSION pins "
            f"writers to: it can be written once every member of the fleet reads a newer version "
            f"and the pin is raised")


class DeliveryError(RunlogError):
    """The broker did not acknowledge a produced record."""

    def __init__(self, topic: str, key: str | None, reason: str) -> None:
        self.topic = topic
        self.key = key
        self.reason = reason
        super().__init__(f"delivery to {topic!r} (key {key!r}) failed: {reason}")


class LogUnavailable(RunlogError):
    """The log could not be read for now: the brokers stayed unreachable, or a partition had no
    leader, past the reader's deadline (a broker restarting, a process resumed after a long pause).
    Nothing was lost and nothing was decided; asking again later is the remedy."""


class LeaseLost(RunlogError):
    """The writer's lease on a run expired or was taken over."""

    def __init__(self, run_id: str, epoch: int, detail: str = "") -> None:
        self.run_id = run_id
        self.epoch = epoch
        self.detail = detail
        super().__init__(f"lease on run {run_id!r} at epoch {epoch} lost{': ' + detail if detail else ''}")


class ArtifactError(RunlogError):
    """An artifact could not be stored or read."""

    def __init__(self, uri: str, detail: str) -> None:
        self.uri = uri
        self.detail = detail
        super().__init__(f"artifact {uri}: {detail}")


class ArtifactMissing(ArtifactError):
    """No artifact is stored under this name."""


class ArtifactCorrupt(ArtifactError):
    """The stored bytes do not hash to the artifact's sha256."""


class PayloadKeyError(ArtifactError):
    """An encrypted payload could not be opened: its subject's data key is missing from the keyring (or the
    key-encryption key that wraps it), or the envelope does not authenticate under it.

    Attributes:
        key_id: the envelope's key id (hex; names the subject's data key, never the payload).
    """

    def __init__(self, key_id: str, detail: str) -> None:
        self.key_id = key_id
        super().__init__(f"key {key_id}", detail)


class SubjectErased(PayloadKeyError):
    """The payload's subject was erased (``runlog erase``): its data key is destroyed, so the payload
    reads nowhere any more. Not a corruption: the run's metadata and hash chain still verify."""


class WorkflowDefinitionError(RunlogError):
    """A workflow, stage or tool is declared in a way Runlog refuses."""


class RunConflict(RunlogError):
    """A run idempotency key was reused with different parameters."""

    def __init__(self, idempotency_key: str, run_id: str, detail: str) -> None:
        self.idempotency_key = idempotency_key
        self.run_id = run_id
        super().__init__(
            f"run idempotency key {idempotency_key!r} already names run {run_id!r}: {detail}"
        )


class RunFailed(RunlogError):
    """An awaited run ended ``FAILED``: a stage failed (``kind``, ``message``: its error;
    ``retryable``: whether ``runlog retry`` may run it again without ``--force``)."""

    def __init__(self, run_id: str, kind: str, message: str, retryable: bool = False) -> None:
        self.run_id = run_id
        self.kind = kind
        self.message = message
        self.retryable = retryable
        super().__init__(f"run {run_id!r} failed: {kind}: {message}")


class RunCancelled(RunlogError):
    """An awaited run was cancelled by an operator (``runlog cancel``); ``reason``: theirs."""

    def __init__(self, run_id: str, reason: str) -> None:
        self.run_id = run_id
        self.reason = reason
        super().__init__(f"run {run_id!r} was cancelled: {reason}")


class ToolError(RunlogError):
    """A tool call failed."""

    retryable: bool = False

    def __init__(self, message: str, *, kind: str | None = None) -> None:
        self.kind = kind or type(self).__name__
        super().__init__(message)


class RetryableToolError(ToolError):
    """A transient failure: the tool's retry policy may call it again."""

    retryable = True


class RateLimited(RetryableToolError):
    """The provider refused the call for now (an HTTP 429): raise it from a tool with the provider's
    ``Retry-After``. A tool with a :class:`~runlog.producers.RateLimit` blocks its key for
    ``retry_after_s`` for every process sharing it; the call is retried by its retry policy."""

    def __init__(self, message: str = "rate limited by the provider", *, retry_after_s: float = 1.0,
                 kind: str | None = None) -> None:
        self.retry_after_s = max(0.0, float(retry_after_s))
        super().__init__(message, kind=kind)


class TerminalToolError(ToolError):
    """A failure that retrying cannot fix: the stage fails at once."""


class VerificationFailed(RunlogError):
    """A stage's verification rules did not all pass."""

    def __init__(self, stage: str, failed: list[str]) -> None:
        self.stage = stage
        self.failed = failed
        super().__init__(f"stage {stage!r} failed verification: {', '.join(failed)}")


class ResumeBlocked(RunlogError):
    """A run cannot be resumed automatically; a person must look at it."""

    def __init__(self, run_id: str, reason: str) -> None:
        self.run_id = run_id
        self.reason = reason
        super().__init__(f"run {run_id!r} is blocked: {reason}")


class Diverged(ResumeBlocked):
    """A call made on resume is not the call recorded at its position (other tool or other
    arguments): its recorded result is never handed back, the run blocks for a person."""

    def __init__(self, run_id: str, call_id: str, recorded: str, new: str) -> None:
        self.call_id = call_id
        self.recorded = recorded
        self.new = new
        super().__init__(run_id, f"call {call_id} diverged from the recorded run: recorded {recorded}, "
                                 f"now {new}; fix the stage, deploy it and continue the run on the fixed "
                                 f"code: runlog retry {run_id} --app MODULE:APP --by WHO (the same "
                                 f"version, fixed), or runlog upgrade {run_id} --to VERSION --app MODULE:APP "
                                 "--by WHO --reason WHY (a new version)")


class EffectInDoubt(ResumeBlocked):
    """An effect's delivery key is open (intent without result) in another run, and the tool's
    policy (``NEVER``) does not allow executing it again without a person."""

    def __init__(self, run_id: str, delivery_key: str, other_run: str, detail: str) -> None:
        self.delivery_key = delivery_key
        self.other_run = other_run
        super().__init__(run_id, detail)


def causes(err: BaseException) -> Iterator[BaseException]:
    """``err`` and what caused it, at every depth (``raise ... from``, or raised while handling),
    each once."""
    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__
