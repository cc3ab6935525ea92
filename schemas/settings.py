"""Runlog's settings: one frozen object built from the environment, the only reader of it.

Every variable, its default and its meaning is listed in the README's
configuration table and in :data:`ENV_VARS`. Client configuration for
librdkafka and redis-py is built here too, so security settings (SASL, TLS,
Redis AUTH) are passed through in one place and never logged.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from schemas.errors import ConfigError

__all__ = ["ENV_VARS", "KAFKA_LOG", "SCHEMA_REGISTRY_KEYS", "Settings", "redact_urls"]

#: (variable, default, meaning) for every environment variable Runlog reads.
ENV_VARS: tuple[tuple[str, str, str], ...] = (
    ("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092", "Kafka bootstrap servers (host:port,...)"),
    ("REDIS_URL", "redis://127.0.0.1:16379/0", "Redis URL (redis:// or rediss://, may carry AUTH;"
     " redis+cluster://host:port[,host:port...] or rediss+cluster://...: a Redis Cluster)"),
    ("RUNLOG_TOPIC_PREFIX", "", "prefix put before every topic name, e.g. `prod.`"),
    ("RUNLOG_REDIS_PREFIX", "runlog", "first segment of every Redis key"),
    ("RUNLOG_PARTITIONS", "12", "partitions of the events, checkpoints, effects and resume topics"),
    ("RUNLOG_REPLICATION_FACTOR", "1", "replication factor of created topics"),
    ("RUNLOG_MIN_INSYNC_REPLICAS", "1", "min.insync.replicas of created topics"),
    ("RUNLOG_EVENTS_RETENTION_MS", "-1", "retention.ms of the events topic (-1: keep forever)"),
    ("RUNLOG_SCHEMA_REGISTRY_URL", "", "Schema Registry URL (http(s)://..., several comma-separated; `mock://NAME`:"
     " an in-process one); when set, records are written in its wire format and both framings are read"),
    ("RUNLOG_SCHEMA_REGISTRY_AUTO_REGISTER", "true", "writers register a record's schema on first use"
     " (`false`: they only look its id up, so `runlog schemas register` must have run)"),
    ("RUNLOG_SCHEMA_REGISTRY_<KEY>", "", "a Schema Registry client setting, e.g."
     " RUNLOG_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO=user:secret sets basic.auth.user.info;"
     " ..._SSL_CA_LOCATION, ..._SSL_CERTIFICATE_LOCATION, ..._SSL_KEY_LOCATION, ..._SSL_KEY_PASSWORD,"
     " ..._BEARER_AUTH_CREDENTIALS_SOURCE, ..._BEARER_AUTH_TOKEN, ..._TIMEOUT, ..._MAX_RETRIES, ..."),
    ("RUNLOG_ARTIFACT_ROOT", ".runlog/artifacts", "root directory of the local artifact store"),
    ("RUNLOG_LEASE_TTL_MS", "15000", "how long a writer's lease lives without a heartbeat"),
    ("RUNLOG_MAX_RECORD_BYTES", "1000000", "largest encoded record accepted"),
    ("RUNLOG_METRICS_PORT", "9464", "Prometheus metrics port of the projector (0: off)"),
    ("RUNLOG_KAFKA_<KEY>", "", "any librdkafka setting, e.g. RUNLOG_KAFKA_SASL_MECHANISM=PLAIN"
     " sets sasl.mechanism; RUNLOG_KAFKA_SECURITY_PROTOCOL, RUNLOG_KAFKA_SSL_CA_LOCATION, ..."),
    ("RUNLOG_DEMO_WORLD_URL", "", "base URL of the demo's external services (set by `runlog demo`)"),
    ("RUNLOG_RESUMER_GROUP", "runlog-resumer", "prefix of the resumer consumer groups: one group"
     " `<prefix>.<app id>` per App, itself under RUNLOG_TOPIC_PREFIX"),
    ("RUNLOG_SWEEP_INTERVAL_MS", "5000", "how often a resumer looks for RUNNING runs whose lease expired"),
    ("RUNLOG_REDIS_USERNAME", "", "Redis ACL user (instead of putting it in REDIS_URL)"),
    ("RUNLOG_REDIS_PASSWORD", "", "Redis AUTH password (instead of putting it in REDIS_URL)"),
    ("RUNLOG_REDIS_SSL_CA_CERTS", "", "rediss:// only: CA file (PEM) that verifies the Redis server"
     " (unset: the system CAs)"),
    ("RUNLOG_REDIS_SSL_CA_PEM", "", "rediss:// only: the CA certificate(s) inline, PEM text"),
    ("RUNLOG_REDIS_SSL_CERTFILE", "", "rediss:// only: client certificate (PEM) for mutual TLS"),
    ("RUNLOG_REDIS_SSL_KEYFILE", "", "rediss:// only: private key (PEM) of the client certificate"),
    ("RUNLOG_REDIS_SSL_KEY_PASSWORD", "", "rediss:// only: passphrase of an encrypted client key"),
    ("RUNLOG_REDIS_SSL_CHECK_HOSTNAME", "true", "rediss:// only: `false` skips matching the server"
     " certificate to the host name (the chain is still verified)"),
    ("RUNLOG_CRASH_AT", "", "fault tests only: a writer point such as `before:EFFECT_INTENT:visual/upload/2`"
     " where the process kills itself with SIGKILL (off when empty)"),
    ("RUNLOG_FAULT_REPORT", ".runlog/reports/faults.json", "where the fault suite writes its JSON summary"),
    ("RUNLOG_CONSOLE_TOKEN", "", "token every action of `runlog console` requires (unset: actions refused,"
     " pages still readable)"),
)

_SECRET_HINTS = ("password", "secret", "token", "key", "credential", "oauthbearer.config")

#: librdkafka's log lines (every client built from :meth:`Settings.kafka_common`), as Python logging
#: records: ``FAIL [rdkafka#consumer-1] [thrd:...]: ...`` at the matching level (3 ERROR, 4 WARNING,
#: 5-6 INFO, 7 DEBUG). Configure this logger to see or silence them; it never prints a credential
#: librdkafka would not print itself.
KAFKA_LOG = logging.getLogger("librdkafka")


def _close_time_noise(text: str) -> bool:
    """A librdkafka line that reports no failure: a SASL exchange cut short because the client is
    being destroyed, or answered after its connection was already down (a clean close of a client
    against a SASL broker, librdkafka issues #5003 and confluent-kafka-python #1780). A real
    authentication failure names the state it failed in (``AUTH_REQ``...), never ``DOWN``."""
    return "SASL authentication error" in text and (
        "Broker handle destroyed" in text or "in state DOWN)" in text)


class _KafkaNoise(logging.Filter):
    """Demotes :func:`_close_time_noise` lines to DEBUG (dropped unless DEBUG is on for the logger)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.DEBUG and _close_time_noise(record.getMessage()):
            if not KAFKA_LOG.isEnabledFor(logging.DEBUG):
                return False
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


if not any(isinstance(f, _KafkaNoise) for f in KAFKA_LOG.filters):
    KAFKA_LOG.addFilter(_KafkaNoise())


#: Schema Registry client settings (confluent-kafka's ``SchemaRegistryClient``) that
#: ``RUNLOG_SCHEMA_REGISTRY_<KEY>`` passes through; the numeric ones are handed over as numbers.
SCHEMA_REGISTRY_KEYS: frozenset[str] = frozenset({
    "basic.auth.user.info", "ssl.ca.location", "ssl.certificate.location", "ssl.key.location",
    "ssl.key.password", "proxy", "bearer.auth.credentials.source", "bearer.auth.token",
    "bearer.auth.logical.cluster", "bearer.auth.identity.pool.id", "bearer.auth.client.id",
    "bearer.auth.client.secret", "bearer.auth.scope", "bearer.auth.issuer.endpoint.url",
    "bearer.auth.issuer.endpoint.query",
    "timeout", "max.retries", "retries.wait.ms", "retries.max.wait.ms", "cache.capacity",
    "cache.latest.ttl.sec",
})
_SR_NUMERIC = frozenset({"timeout", "max.retries", "retries.wait.ms", "retries.max.wait.ms", "cache.capacity",
                         "cache.latest.ttl.sec"})
_SR_OWN = ("RUNLOG_SCHEMA_REGISTRY_URL", "RUNLOG_SCHEMA_REGISTRY_AUTO_REGISTER")
_SR_SECRET_HINTS = (*_SECRET_HINTS, "user.info")


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("true", "1", "yes", "on"):
        return True
    if raw in ("false", "0", "no", "off"):
        return False
    raise ConfigError(f"{name} must be true or false, got {raw!r}")


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None


@dataclass(frozen=True, kw_only=True)
class Settings:
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
    schema_registry_url: str | None = None
    """Schema Registry URL(s); None: records are single-object encoded and no registry is used."""
    schema_registry_auto_register: bool = True
    """Writers register their schemas (False: look the ids up only)."""
    schema_registry_extra: Mapping[str, str] = field(default_factory=dict)
    """Schema Registry client settings passed through as given (auth, TLS, timeouts, ...)."""
    artifact_root: str = ".runlog/artifacts"
    lease_ttl_ms: int = 15_000
    max_record_bytes: int = 1_000_000
    metrics_port: int = 9464
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
    demo_world_url: str | None = None
    """Base URL of the demo's external services."""
    resumer_group: str = "runlog-resumer"
    sweep_interval_ms: int = 5000
    fault_report: str = ".runlog/reports/faults.json"
    """Where the fault suite writes its machine-readable summary."""
    console_token: str | None = None
    """The token every action of ``runlog console`` requires; None refuses every action."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Build settings from ``RUNLOG_*`` variables (``os.environ`` by default)."""
        e = os.environ if env is None else env
        extra = {
            k[len("RUNLOG_KAFKA_"):].lower().replace("_", "."): v
            for k, v in e.items()
            if k.startswith("RUNLOG_KAFKA_") and v
        }
        sr_extra = {
            k[len("RUNLOG_SCHEMA_REGISTRY_"):].lower().replace("_", "."): v
            for k, v in e.items()
            if k.startswith("RUNLOG_SCHEMA_REGISTRY_") and k not in _SR_OWN and v
        }
        s = cls(
            kafka_bootstrap_servers=e.get("KAFKA_BOOTSTRAP_SERVERS") or cls.kafka_bootstrap_servers,
            redis_url=e.get("REDIS_URL") or cls.redis_url,
            topic_prefix=e.get("RUNLOG_TOPIC_PREFIX", ""),
            redis_prefix=e.get("RUNLOG_REDIS_PREFIX") or "runlog",
            partitions=_int(e, "RUNLOG_PARTITIONS", 12),
            replication_factor=_int(e, "RUNLOG_REPLICATION_FACTOR", 1),
            min_insync_replicas=_int(e, "RUNLOG_MIN_INSYNC_REPLICAS", 1),
            events_retention_ms=_int(e, "RUNLOG_EVENTS_RETENTION_MS", -1),
            schema_registry_url=e.get("RUNLOG_SCHEMA_REGISTRY_URL") or None,
            schema_registry_auto_register=_bool(e, "RUNLOG_SCHEMA_REGISTRY_AUTO_REGISTER", True),
            schema_registry_extra=sr_extra,
            artifact_root=e.get("RUNLOG_ARTIFACT_ROOT") or ".runlog/artifacts",
            lease_ttl_ms=_int(e, "RUNLOG_LEASE_TTL_MS", 15_000),
            max_record_bytes=_int(e, "RUNLOG_MAX_RECORD_BYTES", 1_000_000),
            metrics_port=_int(e, "RUNLOG_METRICS_PORT", 9464),
            kafka_extra=extra,
            redis_username=e.get("RUNLOG_REDIS_USERNAME") or None,
            redis_password=e.get("RUNLOG_REDIS_PASSWORD") or None,
            redis_ssl_ca_certs=e.get("RUNLOG_REDIS_SSL_CA_CERTS") or None,
            redis_ssl_ca_pem=e.get("RUNLOG_REDIS_SSL_CA_PEM") or None,
            redis_ssl_certfile=e.get("RUNLOG_REDIS_SSL_CERTFILE") or None,
            redis_ssl_keyfile=e.get("RUNLOG_REDIS_SSL_KEYFILE") or None,
            redis_ssl_key_password=e.get("RUNLOG_REDIS_SSL_KEY_PASSWORD") or None,
            redis_ssl_check_hostname=_bool(e, "RUNLOG_REDIS_SSL_CHECK_HOSTNAME", True),
            demo_world_url=e.get("RUNLOG_DEMO_WORLD_URL") or None,
            resumer_group=e.get("RUNLOG_RESUMER_GROUP") or "runlog-resumer",
            sweep_interval_ms=_int(e, "RUNLOG_SWEEP_INTERVAL_MS", 5000),
            fault_report=e.get("RUNLOG_FAULT_REPORT") or ".runlog/reports/faults.json",
            console_token=e.get("RUNLOG_CONSOLE_TOKEN") or None,
        )
        s = replace(s, **overrides) if overrides else s
        s.validate()
        return s

    def to_env(self) -> dict[str, str]:
        """The environment variables that rebuild these settings in a child process.

        The inverse of :meth:`from_env`: ``Settings.from_env(s.to_env()) == s``. It holds
        credentials, so it is for a child's environment only, never for printing.
        """
        env = {
            "KAFKA_BOOTSTRAP_SERVERS": self.kafka_bootstrap_servers,
            "REDIS_URL": self.redis_url,
            "RUNLOG_TOPIC_PREFIX": self.topic_prefix,
            "RUNLOG_REDIS_PREFIX": self.redis_prefix,
            "RUNLOG_PARTITIONS": str(self.partitions),
            "RUNLOG_REPLICATION_FACTOR": str(self.replication_factor),
            "RUNLOG_MIN_INSYNC_REPLICAS": str(self.min_insync_replicas),
            "RUNLOG_EVENTS_RETENTION_MS": str(self.events_retention_ms),
            "RUNLOG_ARTIFACT_ROOT": self.artifact_root,
            "RUNLOG_LEASE_TTL_MS": str(self.lease_ttl_ms),
            "RUNLOG_MAX_RECORD_BYTES": str(self.max_record_bytes),
            "RUNLOG_METRICS_PORT": str(self.metrics_port),
            "RUNLOG_RESUMER_GROUP": self.resumer_group,
            "RUNLOG_SWEEP_INTERVAL_MS": str(self.sweep_interval_ms),
            "RUNLOG_FAULT_REPORT": self.fault_report,
            "RUNLOG_REDIS_SSL_CHECK_HOSTNAME": "true" if self.redis_ssl_check_hostname else "false",
            "RUNLOG_SCHEMA_REGISTRY_AUTO_REGISTER": "true" if self.schema_registry_auto_register else "false",
        }
        optional = {
            "RUNLOG_SCHEMA_REGISTRY_URL": self.schema_registry_url,
            "RUNLOG_DEMO_WORLD_URL": self.demo_world_url,
            "RUNLOG_REDIS_USERNAME": self.redis_username,
            "RUNLOG_REDIS_PASSWORD": self.redis_password,
            "RUNLOG_REDIS_SSL_CA_CERTS": self.redis_ssl_ca_certs,
            "RUNLOG_REDIS_SSL_CA_PEM": self.redis_ssl_ca_pem,
            "RUNLOG_REDIS_SSL_CERTFILE": self.redis_ssl_certfile,
            "RUNLOG_REDIS_SSL_KEYFILE": self.redis_ssl_keyfile,
            "RUNLOG_REDIS_SSL_KEY_PASSWORD": self.redis_ssl_key_password,
            "RUNLOG_CONSOLE_TOKEN": self.console_token,
        }
        env.update({k: v for k, v in optional.items() if v})
        for key, value in self.kafka_extra.items():
            env["RUNLOG_KAFKA_" + key.upper().replace(".", "_")] = value
        for key, value in self.schema_registry_extra.items():
            env["RUNLOG_SCHEMA_REGISTRY_" + key.upper().replace(".", "_")] = value
        return env

    def with_(self, **changes: Any) -> Settings:
        """A copy with some settings changed."""
        return replace(self, **changes)

    def validate(self) -> None:
        if self.partitions < 1:
            raise ConfigError("RUNLOG_PARTITIONS must be >= 1")
        if self.replication_factor < 1:
            raise ConfigError("RUNLOG_REPLICATION_FACTOR must be >= 1")
        if not 1 <= self.min_insync_replicas <= self.replication_factor:
            raise ConfigError(
                "RUNLOG_MIN_INSYNC_REPLICAS must be between 1 and RUNLOG_REPLICATION_FACTOR"
            )
        if self.lease_ttl_ms < 100:
            raise ConfigError("RUNLOG_LEASE_TTL_MS must be >= 100")
        if not self.redis_url.startswith(("redis://", "rediss://", "unix://", "redis+cluster://",
                                          "rediss+cluster://")):
            raise ConfigError("REDIS_URL must start with redis://, rediss://, unix://, redis+cluster:// or "
                              "rediss+cluster://")
        if self.redis_url.startswith(("redis+cluster://", "rediss+cluster://")):
            from schemas._redis import cluster_nodes
            cluster_nodes(self.redis_url)  # a ConfigError when malformed
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
        for k in sorted(_SR_NUMERIC & set(self.schema_registry_extra)):
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

    # -- client configuration, built in one place ---------------------------------------------

    def group_id(self, name: str) -> str:
        """The consumer group id for ``name``: ``<topic_prefix><name>``, so a tenant's ACLs can be
        scoped to its prefix (group ids as well as topics). Every group Runlog joins or reads
        offsets of is named through here (:meth:`consumer_config` applies it too); a name that
        already starts with the prefix is kept as it is, and with no prefix every name is unchanged."""
        p = self.topic_prefix
        return name if not p or name.startswith(p) else p + name

    def kafka_common(self) -> dict[str, Any]:
        """librdkafka settings shared by every client: servers plus pass-through security.

        librdkafka's own log lines go to the ``librdkafka`` Python logger (:data:`KAFKA_LOG`)
        instead of straight to stderr, served by the client's poll calls; known close-time noise
        is demoted to DEBUG there. With ``RUNLOG_KAFKA_DEBUG`` set, librdkafka prints to stderr
        itself, as asked."""
        conf: dict[str, Any] = {"bootstrap.servers": self.kafka_bootstrap_servers}
        if "debug" not in self.kafka_extra:
            conf["logger"] = KAFKA_LOG
        conf.update(self.kafka_extra)
        return conf

    def producer_config(self, **overrides: Any) -> dict[str, Any]:
        """An idempotent, acks=all producer: no acknowledged event is lost or duplicated."""
        conf = self.kafka_common()
        conf.update(
            {
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "compression.type": "lz4",
                "message.timeout.ms": 120_000,
                "partitioner": "murmur2_random",
            }
        )
        conf.update(overrides)
        return conf

    def consumer_config(self, group_id: str, **overrides: Any) -> dict[str, Any]:
        """A consumer that commits only what it has processed (at-least-once), in the group
        :meth:`group_id` (``group_id``) names."""
        conf = self.kafka_common()
        conf.update(
            {
                "group.id": self.group_id(group_id),
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
                "partition.assignment.strategy": "cooperative-sticky",
            }
        )
        conf.update(overrides)
        return conf

    def admin_config(self) -> dict[str, Any]:
        return self.kafka_common()

    def schema_registry_config(self) -> dict[str, Any]:
        """Configuration of confluent-kafka's ``SchemaRegistryClient``: the URL plus every
        ``RUNLOG_SCHEMA_REGISTRY_<KEY>`` setting (numbers as numbers). Holds credentials: never log it.

        Raises:
            ConfigError: ``RUNLOG_SCHEMA_REGISTRY_URL`` is not set.
        """
        if not self.schema_registry_url:
            raise ConfigError("RUNLOG_SCHEMA_REGISTRY_URL is not set")
        conf: dict[str, Any] = {"url": self.schema_registry_url}
        for k, v in self.schema_registry_extra.items():
            conf[k] = (float(v) if "." in v else int(v)) if k in _SR_NUMERIC else v
        return conf

    def redis_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``redis.Redis.from_url(self.redis_url, **kwargs)``."""
        kw: dict[str, Any] = {"decode_responses": False}
        if self.redis_username:
            kw["username"] = self.redis_username
        if self.redis_password:
            kw["password"] = self.redis_password
        if self.redis_url.startswith("rediss://"):
            kw["ssl_check_hostname"] = self.redis_ssl_check_hostname
            tls = {"ssl_ca_certs": self.redis_ssl_ca_certs, "ssl_ca_data": self.redis_ssl_ca_pem,
                   "ssl_certfile": self.redis_ssl_certfile, "ssl_keyfile": self.redis_ssl_keyfile,
                   "ssl_password": self.redis_ssl_key_password}
            kw.update({k: v for k, v in tls.items() if v})
        return kw

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
            elif f.name in ("redis_password", "redis_ssl_key_password", "console_token") and v:
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
