"""Runlog's settings: one frozen object built from the environment, the only reader of it.

Every variable, its default and its meaning is listed in :data:`ENV_VARS`
(:mod:`runlog.schemas._env`, which parses the environment and writes it back), from which
the docs' configuration reference (docs/reference/configuration.md) is generated.
Client configuration for librdkafka, the Schema Registry client and redis-py is built
by the methods of
:class:`~runlog.schemas._client_config.ClientConfig`, a base of :class:`Settings`, so
security settings (SASL, TLS, Redis AUTH) are passed through in one place and
never logged; this module validates the settings and masks their secrets.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from runlog.schemas._client_config import (
    KAFKA_LOG,
    SCHEMA_REGISTRY_KEYS,
    SR_NUMERIC,
    ClientConfig,
    check_kafka_guarantees,
)
from runlog.schemas._env import ENV_VARS, env_from_values, values_from_env
from runlog.schemas.errors import ConfigError

__all__ = ["ENV_VARS", "KAFKA_LOG", "SCHEMA_REGISTRY_KEYS", "Settings", "redact_urls"]

_SECRET_FIELDS = ("redis_password", "redis_ssl_key_password", "console_token", "transit_token")
_SECRET_HINTS = ("password", "secret", "token", "key", "credential", "oauthbearer.config")
_SR_SECRET_HINTS = (*_SECRET_HINTS, "user.info")
_INSTANCE_ID = re.compile(r"[A-Za-z0-9._-]{1,249}")


@dataclass(frozen=True, kw_only=True)
class Settings(ClientConfig):
    """Configuration of every Runlog component."""

    kafka_bootstrap_servers: str = "127.0.0.1:19092"
    """Kafka bootstrap servers."""
    redis_url: str = "redis://127.0.0.1:16379/0"
    """Redis URL; may carry credentials, which are never printed."""
    topic_prefix: str = ""
    """Put before every topic name, so tenants or environments can share a cluster."""
    redis_prefix: str = "runlog"
    """First segment of every Redis key."""
    partitions: int = 12
    replication_factor: int = 1
    min_insync_replicas: int = 1
    events_retention_ms: int = -1
    streams_retention_ms: int = 7 * 24 * 3600 * 1000
    """retention.ms of the streams topic (model output while it streams; -1: keep forever)."""
    schema_registry_url: str | None = None
    """Schema Registry URL(s); None: records are single-object encoded and no registry is used."""
    schema_registry_auto_register: bool = True
    """Writers register their schemas (False: look the ids up only)."""
    schema_registry_extra: Mapping[str, str] = field(default_factory=dict)
    """Schema Registry client settings passed through as given (auth, TLS, timeouts, ...)."""
    schema_version: int | None = None
    """The schema version writers write (``RUNLOG_SCHEMA_VERSION``): during a rolling upgrade, the
    oldest version any member of the fleet reads; None: the current version
    (:mod:`runlog.schemas._versions`)."""
    artifact_root: str = ".runlog/artifacts"
    artifact_inline_bytes: int = 512
    """Payloads (a call's arguments and result, a stage's output) of up to this many bytes travel inside
    their event as a ``data:`` URI instead of a file of the artifact store (0: every payload in the store)."""
    lease_ttl_ms: int = 15_000
    max_record_bytes: int = 1_000_000
    metrics_port: int = 9464
    metrics_host: str = "127.0.0.1"
    """The interface the metrics endpoints listen on (projector, resumer): loopback unless set
    (``0.0.0.0`` for a Prometheus scraping from another host or pod)."""
    kafka_extra: Mapping[str, str] = field(default_factory=dict)
    """librdkafka settings passed through as given (SASL, TLS, ...)."""
    redis_username: str | None = None
    redis_password: str | None = None
    redis_ssl_ca_certs: str | None = None
    """rediss:// only: CA file verifying the server (None: the system CAs)."""
    redis_ssl_ca_pem: str | None = None
    """rediss:// only: CA certificate(s) as PEM text."""
    redis_ssl_certfile: str | None = None
    """rediss:// only: client certificate (mutual TLS)."""
    redis_ssl_keyfile: str | None = None
    """rediss:// only: the client certificate's private key."""
    redis_ssl_key_password: str | None = None
    """rediss:// only: passphrase of an encrypted client key; a secret."""
    redis_ssl_check_hostname: bool = True
    """rediss:// only: match the server certificate to the host name."""
    redis_failover_ms: int = 20_000
    """Redis Cluster only: how long a command keeps retrying (with backoff) while its slot's
    master is unreachable, so a replica's promotion is waited out instead of failing the run."""
    redis_wait_replicas: int | None = None
    """How many replicas must acknowledge a projection apply's writes (Redis ``WAIT``) on every
    primary it wrote to before the projector commits the batch, so a failover cannot lose them.
    None ("auto"): on Redis Cluster, one on each primary that has one online (none on a standalone
    server); 0: never wait; N: N, on a cluster or a standalone server."""
    redis_wait_ms: int = 2000
    """How long an apply waits for those replicas; too few by then fails the apply, which the
    projector retries. Under the client's socket timeout (redis-py's 5 s), which WAIT answers within."""
    demo_world_url: str | None = None
    """Base URL of the demo's external services."""
    resumer_group: str = "runlog-resumer"
    sweep_interval_ms: int = 5000
    startup_wait_ms: int = 60_000
    """How long a member (``runlog project``, ``resumer``, ``worker``) tries again at start while
    Redis (and, for the projector, Kafka) does not answer, with a line on stderr for each try, before
    it exits 3; 0: it exits at the first failure. A refused password or certificate is never waited
    out (:mod:`runlog.processors._startup`)."""
    limit_durable_wait_ms: int = 2000
    """A call that its rate limit makes wait longer than this lets go of its run (a durable wait: no
    lease, no thread, woken by the fleet's timers); a shorter wait is waited in the call's thread."""
    group_instance_id: str | None = None
    """Static group membership: the ``group.instance.id`` of the resumer's consumer
    (:meth:`~runlog.schemas._client_config.ClientConfig.member_config`). Unique per member and stable
    across its restarts (the pod name, say): a member back within the session timeout keeps its
    partitions without a rebalance, and one gone is noticed only after that timeout. None: dynamic
    membership (a member joins and leaves the group)."""
    fault_report: str = ".runlog/reports/faults.json"
    """Where the fault suite writes its machine-readable summary."""
    console_token: str | None = None
    """The token every action of ``runlog console`` requires; None refuses every action."""
    tracing: bool = True
    """Runlog's processors (resumer, projector, operator commands) open OpenTelemetry spans through
    the global tracer provider (or one passed in) and put their W3C trace context on the records
    they write; needs the ``otel`` extra. False: no spans, no trace headers from them."""
    encryption: bool = False
    """Seal every payload under its subject's data key (AES-256-GCM; needs the ``crypto`` extra)."""
    keyring: str = ".runlog/keyring"
    """The local keyring directory: key-encryption keys and the subjects' wrapped data keys."""
    default_subject: str = "default"
    """The subject of runs started without one."""
    key_provider: str = "local"
    """Who holds the key-encryption keys: ``local`` (files in :attr:`keyring`) or ``transit`` (HashiCorp
    Vault's or OpenBao's transit engine at :attr:`transit_addr`; the wrapped data keys stay in the
    keyring)."""
    transit_addr: str | None = None
    """``transit``: the server's address (``http(s)://host:8200``)."""
    transit_mount: str = "transit"
    """``transit``: the path the transit engine is mounted at."""
    transit_key: str = "runlog"
    """``transit``: the name of the transit key that wraps the data keys."""
    transit_token: str | None = None
    """``transit``: the token sent as ``X-Vault-Token``; a secret, never logged."""

    @property
    def inline_payload_bytes(self) -> int:
        """The payload size up to which writers put a payload inside its event (a ``data:`` URI):
        :attr:`artifact_inline_bytes`, or 0 while writers are pinned below the current schema version
        (a reader of an older version may not read ``data:`` URIs)."""
        from runlog.schemas._versions import CURRENT_SCHEMA_VERSION
        if self.schema_version is not None and self.schema_version < CURRENT_SCHEMA_VERSION:
            return 0
        return self.artifact_inline_bytes

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Build settings from ``RUNLOG_*`` variables (``os.environ`` by default)."""
        s = cls(**values_from_env(os.environ if env is None else env))
        s = replace(s, **overrides) if overrides else s
        s.validate()
        return s

    def to_env(self) -> dict[str, str]:
        """The environment variables that rebuild these settings in a child process.

        The inverse of :meth:`from_env`: ``Settings.from_env(s.to_env()) == s``. It holds
        credentials, so it is for a child's environment only, never for printing.
        """
        return env_from_values({f.name: getattr(self, f.name) for f in fields(self)})

    def with_(self, **changes: Any) -> Settings:
        """A copy with some settings changed."""
        return replace(self, **changes)

    def validate(self) -> None:
        check_kafka_guarantees(self.kafka_extra)
        if self.partitions < 1:
            raise ConfigError("RUNLOG_PARTITIONS must be >= 1")
        if self.replication_factor < 1:
            raise ConfigError("RUNLOG_REPLICATION_FACTOR must be >= 1")
        if not 1 <= self.min_insync_replicas <= self.replication_factor:
            raise ConfigError(
                "RUNLOG_MIN_INSYNC_REPLICAS must be between 1 and RUNLOG_REPLICATION_FACTOR"
            )
        if self.redis_wait_replicas is not None and self.redis_wait_replicas < 0:
            raise ConfigError("RUNLOG_REDIS_WAIT_REPLICAS must be auto or a number >= 0")
        if self.redis_wait_ms < 1:
            raise ConfigError("RUNLOG_REDIS_WAIT_MS must be >= 1")
        if not 0 <= self.artifact_inline_bytes <= self.max_record_bytes // 8:
            raise ConfigError("RUNLOG_ARTIFACT_INLINE_BYTES must be between 0 and RUNLOG_MAX_RECORD_BYTES"
                              f" / 8, got {self.artifact_inline_bytes}")
        from runlog.schemas._versions import check_version
        check_version(self.schema_version)
        if self.limit_durable_wait_ms < 0:
            raise ConfigError("RUNLOG_LIMIT_DURABLE_WAIT_MS must be >= 0")
        if self.startup_wait_ms < 0:
            raise ConfigError("RUNLOG_STARTUP_WAIT_MS must be >= 0")
        if self.lease_ttl_ms < 100:
            raise ConfigError("RUNLOG_LEASE_TTL_MS must be >= 100")
        if not self.redis_url.startswith(("redis://", "rediss://", "unix://", "redis+cluster://",
                                          "rediss+cluster://")):
            raise ConfigError("REDIS_URL must start with redis://, rediss://, unix://, redis+cluster:// or "
                              "rediss+cluster://")
        if self.redis_url.startswith(("redis+cluster://", "rediss+cluster://")):
            from runlog.schemas._redis import cluster_nodes
            cluster_nodes(self.redis_url)  # a ConfigError when malformed
        else:
            from runlog.schemas._redis import url_options_refused
            refused = url_options_refused(self.redis_url)
            if "cluster" in refused:
                raise ConfigError("REDIS_URL: ?cluster= is not an option of a redis:// URL; for Redis "
                                  "Cluster use redis+cluster://host:port[,host:port...] (rediss+cluster:// "
                                  "for TLS)")
            if refused:
                raise ConfigError(f"REDIS_URL: unknown query option(s) {', '.join(refused)} (the Redis "
                                  "client takes connection settings such as socket_timeout, "
                                  "health_check_interval)")
        if not self.redis_url.startswith(("rediss://", "rediss+cluster://")):
            # a TLS setting with a plain-text URL would be dropped silently: refuse it instead
            tls = [name for name, on in (
                ("RUNLOG_REDIS_SSL_CA_CERTS", self.redis_ssl_ca_certs),
                ("RUNLOG_REDIS_SSL_CA_PEM", self.redis_ssl_ca_pem),
                ("RUNLOG_REDIS_SSL_CERTFILE", self.redis_ssl_certfile),
                ("RUNLOG_REDIS_SSL_KEYFILE", self.redis_ssl_keyfile),
                ("RUNLOG_REDIS_SSL_KEY_PASSWORD", self.redis_ssl_key_password),
                ("RUNLOG_REDIS_SSL_CHECK_HOSTNAME", not self.redis_ssl_check_hostname),
            ) if on]
            if tls:
                raise ConfigError(f"{', '.join(tls)} set, but REDIS_URL is not rediss:// (no TLS to "
                                  f"apply them to): use a rediss:// URL or unset them")
        if self.group_instance_id is not None and not _INSTANCE_ID.fullmatch(self.group_instance_id):
            raise ConfigError("RUNLOG_GROUP_INSTANCE_ID must be 1 to 249 letters, digits, '.', '_' or '-' "
                              f"(a Kafka group.instance.id), got {self.group_instance_id!r}")
        if self.redis_ssl_keyfile and not self.redis_ssl_certfile:
            raise ConfigError("RUNLOG_REDIS_SSL_KEYFILE needs RUNLOG_REDIS_SSL_CERTFILE")
        self._validate_schema_registry()

    def _validate_schema_registry(self) -> None:
        def var(key: str) -> str:
            return "RUNLOG_SCHEMA_REGISTRY_" + key.upper().replace(".", "_")

        unknown = sorted(var(k) for k in self.schema_registry_extra if k not in SCHEMA_REGISTRY_KEYS)
        if unknown:
            raise ConfigError(f"{', '.join(unknown)}: not a Schema Registry client setting (known: "
                              f"{', '.join(sorted(var(k) for k in SCHEMA_REGISTRY_KEYS))})")
        for k in sorted(SR_NUMERIC & set(self.schema_registry_extra)):
            try:
                float(self.schema_registry_extra[k])
            except ValueError:
                got = self.schema_registry_extra[k]
                raise ConfigError(f"{var(k)} must be a number, got {got!r}") from None
        if self.schema_registry_url is None:
            if self.schema_registry_extra:
                raise ConfigError(f"{', '.join(sorted(var(k) for k in self.schema_registry_extra))} set, but "
                                  "RUNLOG_SCHEMA_REGISTRY_URL is not: set the URL or unset them")
            return
        for url in self.schema_registry_url.split(","):
            if not url.strip().startswith(("http://", "https://", "mock://")):
                raise ConfigError("RUNLOG_SCHEMA_REGISTRY_URL must be http://, https:// or mock:// URLs "
                                  f"(comma-separated), got {_redact_url(url.strip())!r}")


    # -- never print secrets -------------------------------------------------------------------

    def redacted(self) -> dict[str, Any]:
        """The settings as a dict with every credential masked, safe to print or log."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "redis_url":
                v = _redact_url(v)
            elif f.name == "schema_registry_url" and v:
                v = redact_urls(v)
            elif f.name in _SECRET_FIELDS and v:
                v = "***"
            elif f.name == "kafka_extra":
                v = {k: ("***" if any(h in k for h in _SECRET_HINTS) else val) for k, val in v.items()}
            elif f.name == "schema_registry_extra":
                v = {k: ("***" if any(h in k for h in _SR_SECRET_HINTS) else val) for k, val in v.items()}
            out[f.name] = v
        return out

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.redacted().items())
        return f"Settings({inner})"


def redact_urls(urls: str) -> str:
    """A comma-separated URL list with every password masked (``http://user:***@host``)."""
    return ",".join(_redact_url(u.strip()) for u in urls.split(","))


def _redact_url(url: str) -> str:
    if "+cluster://" in url:  # several hosts: urlsplit cannot read its port
        scheme, _, rest = url.partition("://")
        userinfo, at, hosts = rest.rpartition("@")
        if not at or ":" not in userinfo:
            return url
        return f"{scheme}://{userinfo.partition(':')[0]}:***@{hosts}"
    parts = urlsplit(url)
    if parts.password is None and parts.username is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    user = parts.username or ""
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, parts.fragment))
