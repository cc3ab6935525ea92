"""The environment Runlog reads: every variable with its default and meaning (:data:`ENV_VARS`,
from which the docs' configuration reference is generated), parsed into the values of
:class:`~runlog.schemas.settings.Settings`' fields (:func:`values_from_env`) and written back from them
(:func:`env_from_values`, for a child process's environment)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runlog.schemas.errors import ConfigError

__all__ = ["ENV_VARS", "env_from_values", "kafka_env_name", "values_from_env"]

#: (variable, default, meaning) for every environment variable Runlog reads.
ENV_VARS: tuple[tuple[str, str, str], ...] = (
    ("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092", "Kafka bootstrap servers (host:port,...); unset, the "
     "port `deploy/local/up` starts, and every `runlog` command names it on its first line"),
    ("REDIS_URL", "redis://127.0.0.1:16379/0", "Redis URL (redis:// or rediss://, may carry AUTH;"
     " redis+cluster://host:port[,host:port...] or rediss+cluster://...: a Redis Cluster); unset, the "
     "port `deploy/local/up` starts, and every `runlog` command names it on its first line"),
    ("RUNLOG_TOPIC_PREFIX", "", "prefix put before every topic name, e.g. `prod.`"),
    ("RUNLOG_REDIS_PREFIX", "runlog", "first segment of every Redis key"),
    ("RUNLOG_PARTITIONS", "12", "partitions of the events, checkpoints, effects, resume, streams,"
     " submissions and dead-letter topics (the schemas and schedules topics have one)"),
    ("RUNLOG_REPLICATION_FACTOR", "1", "replication factor of created topics"),
    ("RUNLOG_MIN_INSYNC_REPLICAS", "1", "min.insync.replicas of created topics"),
    ("RUNLOG_EVENTS_RETENTION_MS", "-1", "retention.ms of the events topic (-1: keep forever)"),
    ("RUNLOG_STREAMS_RETENTION_MS", "604800000", "retention.ms of the streams topic, model output while it"
     " streams (default 7 days; -1: keep forever)"),
    ("RUNLOG_SCHEMA_REGISTRY_URL", "", "Schema Registry URL (http(s)://..., several comma-separated; `mock://NAME`:"
     " an in-process one); when set, records are written in its wire format and both framings are read"),
    ("RUNLOG_SCHEMA_REGISTRY_AUTO_REGISTER", "true", "writers register a record's schema on first use"
     " (`false`: they only look its id up, so `runlog schemas register` must have run)"),
    ("RUNLOG_SCHEMA_REGISTRY_<KEY>", "", "a Schema Registry client setting, e.g."
     " RUNLOG_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO=user:secret sets basic.auth.user.info;"
     " ..._SSL_CA_LOCATION, ..._SSL_CERTIFICATE_LOCATION, ..._SSL_KEY_LOCATION, ..._SSL_KEY_PASSWORD,"
     " ..._BEARER_AUTH_CREDENTIALS_SOURCE, ..._BEARER_AUTH_TOKEN, ..._TIMEOUT, ..._MAX_RETRIES, ..."),
    ("RUNLOG_SCHEMA_VERSION", "", "the schema version writers write: during a rolling upgrade of Runlog, the"
     " oldest version any member of the fleet reads (3 to 5; unset: the current one, 5); pinned below the"
     " current one, every payload goes to the artifact store; see docs/how-to/upgrade-runlog.md"),
    ("RUNLOG_ARTIFACT_ROOT", ".runlog/artifacts", "root directory of the local artifact store"),
    ("RUNLOG_ARTIFACT_INLINE_BYTES", "512", "payloads (a call's arguments and result, a stage's output) of up"
     " to this many bytes travel inside their event as a `data:` URI, durable with it, instead of an fsynced"
     " file of the artifact store; `0`: every payload in the store (e.g. when services that must not see"
     " payloads read the events topic)"),
    ("RUNLOG_LEASE_TTL_MS", "15000", "how long a writer's lease lives without a heartbeat"),
    ("RUNLOG_MAX_RECORD_BYTES", "1000000", "largest encoded record accepted"),
    ("RUNLOG_METRICS_PORT", "9464", "Prometheus metrics port of the projector (0: off)"),
    ("RUNLOG_METRICS_HOST", "127.0.0.1", "interface the metrics endpoints (projector, resumer) listen on;"
     " 0.0.0.0 for a Prometheus on another host or pod"),
    ("RUNLOG_KAFKA_<KEY>", "", "any librdkafka setting, e.g. RUNLOG_KAFKA_SASL_MECHANISM=PLAIN"
     " sets sasl.mechanism; RUNLOG_KAFKA_SECURITY_PROTOCOL, RUNLOG_KAFKA_SSL_CA_LOCATION, ...;"
     " the event producers' linger.ms (5), compression.type (lz4) and message.timeout.ms (120000) are"
     " defaults it replaces, their enable.idempotence=true, acks=all and partitioner=murmur2_random are"
     " kept (another value is refused); so are the consumers' enable.auto.commit=false,"
     " auto.offset.reset=earliest, isolation.level=read_committed and"
     " partition.assignment.strategy=cooperative-sticky, and group.id is refused (groups are named by"
     " Runlog); the resumer's and worker's session.timeout.ms (10000) and max.poll.interval.ms (600000)"
     " are defaults it replaces"),
    ("RUNLOG_DEMO_WORLD_URL", "", "base URL of the demo's external services (set by `runlog demo`)"),
    ("RUNLOG_RESUMER_GROUP", "runlog-resumer", "prefix of the resumer consumer groups: one group"
     " `<prefix>.<app id>` per App, itself under RUNLOG_TOPIC_PREFIX"),
    ("RUNLOG_LIMIT_DURABLE_WAIT_MS", "2000", "a call that its rate limit (`@tool(limit=)`) makes wait longer"
     " than this lets go of its run (no lease, no thread) and is woken by the fleet when the limit says it"
     " fits; a shorter wait is waited in the call's thread"),
    ("RUNLOG_SWEEP_INTERVAL_MS", "5000", "how often a resumer looks for RUNNING runs whose lease expired"),
    ("RUNLOG_STARTUP_WAIT_MS", "60000", "how long `runlog project`, `resumer` and `worker` try again at start"
     " while Redis (and, for the projector, Kafka) does not answer, one line on stderr per try, before"
     " exiting 3 (services started before their dependencies); `0`: exit at the first failure; a refused"
     " password or certificate exits at once; SIGTERM during the wait exits 0"),
    ("RUNLOG_GROUP_INSTANCE_ID", "", "static membership: the resumer consumer's `group.instance.id`;"
     " unique per member and stable across its restarts (e.g. the pod name); a process with several"
     " consumers suffixes it per group. Unset: dynamic membership"),
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
    ("RUNLOG_REDIS_FAILOVER_MS", "20000", "Redis Cluster only: how long a command keeps retrying while its"
     " slot's master is unreachable (a replica's promotion is waited out)"),
    ("RUNLOG_REDIS_WAIT_REPLICAS", "auto", "replicas that must acknowledge the projector's writes"
     " (Redis WAIT) on every primary written to before a batch is committed; `auto`: on Redis Cluster"
     " one on each primary that has one online (none on a standalone server); `0`: never wait;"
     " N: N, cluster or standalone"),
    ("RUNLOG_REDIS_WAIT_MS", "2000", "how long the projector waits for those replicas; too few by then fails"
     " the batch's apply, which is retried"),
    ("RUNLOG_CRASH_AT", "", "fault tests only: a writer point such as `before:EFFECT_INTENT:visual/upload/2`"
     " where the process kills itself with SIGKILL (off when empty)"),
    ("RUNLOG_TRACEBACK", "", "`1`: a `runlog` command that meets an error it does not translate prints its "
     "traceback after its one line (for a bug report)"),
    ("RUNLOG_LOCAL_DIR", ".runlog", "where `deploy/local/up` keeps its services' files and the Kafka jars,"
     " and `deploy/local/toxiproxy build` its binary; `runlog chaos` starts its private broker and"
     " Toxiproxy from there"),
    ("RUNLOG_JAVA", "", "the `java` `runlog chaos` starts its private broker with (unset: JAVA_HOME's, then"
     " the PATH's)"),
    ("RUNLOG_CHAOS_RUN", "", "set by `runlog chaos` in the environment of every process it starts (its"
     " run's id): should the run be killed, its watchdog kills the processes carrying it; not a setting"),
    ("RUNLOG_FAULT_REPORT", ".runlog/reports/faults.json", "fault tests only: where the fault suite"
     " (tests/faults) writes its JSON summary"),
    ("RUNLOG_CONSOLE_TOKEN", "", "token every action of `runlog console` requires (unset: actions refused,"
     " pages still readable)"),
    ("RUNLOG_TRACING", "true", "the resumer, the projector and the operator commands open OpenTelemetry spans"
     " (global tracer provider; needs `runlog[otel]`) and put their trace context on the records they"
     " write; `false`: none"),
    ("RUNLOG_ENCRYPTION", "false", "`true`: every payload (parameters, call arguments and results, stage"
     " outputs, inline refs, artifacts, stream text, signal data) is sealed with AES-256-GCM under its"
     " subject's data key before it leaves the process (docs: how-to/privacy); `false`: payloads in clear"),
    ("RUNLOG_KEYRING", ".runlog/keyring", "directory of the local keyring (0700; files 0600): the"
     " key-encryption keys and each subject's wrapped data key; every process of a deployment that reads"
     " payloads needs the same keyring"),
    ("RUNLOG_DEFAULT_SUBJECT", "default", "the subject of runs started without one (its data key seals"
     " their payloads)"),
    ("RUNLOG_KEY_PROVIDER", "local", "who holds the key-encryption keys: `local` (files in the keyring) or"
     " `transit` (HashiCorp Vault's or OpenBao's transit engine wraps the data keys)"),
    ("RUNLOG_TRANSIT_ADDR", "", "`transit`: the server's address, e.g. `https://vault.internal:8200`"),
    ("RUNLOG_TRANSIT_MOUNT", "transit", "`transit`: the path the transit engine is mounted at"),
    ("RUNLOG_TRANSIT_KEY", "runlog", "`transit`: the transit key that wraps the data keys"),
    ("RUNLOG_TRANSIT_TOKEN", "", "`transit`: the token sent as `X-Vault-Token` (a secret: never logged)"),
)

_SR_OWN = ("RUNLOG_SCHEMA_REGISTRY_URL", "RUNLOG_SCHEMA_REGISTRY_AUTO_REGISTER")


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


def _optional_int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name, "").strip()
    return None if not raw else _int(env, name, 0)


def _replicas(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name, "").strip().lower()
    if raw in ("", "auto"):
        return None
    return _int(env, name, 0)


def kafka_env_name(key: str) -> str:
    """The environment variable that sets librdkafka's ``key`` (``RUNLOG_KAFKA_<KEY>``: what
    :func:`values_from_env` reads into ``kafka_extra``)."""
    return "RUNLOG_KAFKA_" + key.upper().replace(".", "_")


def values_from_env(e: Mapping[str, str]) -> dict[str, Any]:
    """The settings' field values that the variables in ``e`` give (unset or empty: the default).

    Raises:
        ConfigError: a number or a flag that is not one.
    """
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
    return dict(
        kafka_bootstrap_servers=e.get("KAFKA_BOOTSTRAP_SERVERS") or "127.0.0.1:19092",
        redis_url=e.get("REDIS_URL") or "redis://127.0.0.1:16379/0",
        topic_prefix=e.get("RUNLOG_TOPIC_PREFIX", ""),
        redis_prefix=e.get("RUNLOG_REDIS_PREFIX") or "runlog",
        partitions=_int(e, "RUNLOG_PARTITIONS", 12),
        replication_factor=_int(e, "RUNLOG_REPLICATION_FACTOR", 1),
        min_insync_replicas=_int(e, "RUNLOG_MIN_INSYNC_REPLICAS", 1),
        events_retention_ms=_int(e, "RUNLOG_EVENTS_RETENTION_MS", -1),
        streams_retention_ms=_int(e, "RUNLOG_STREAMS_RETENTION_MS", 604_800_000),
        schema_registry_url=e.get("RUNLOG_SCHEMA_REGISTRY_URL") or None,
        schema_registry_auto_register=_bool(e, "RUNLOG_SCHEMA_REGISTRY_AUTO_REGISTER", True),
        schema_registry_extra=sr_extra,
        schema_version=_optional_int(e, "RUNLOG_SCHEMA_VERSION"),
        artifact_root=e.get("RUNLOG_ARTIFACT_ROOT") or ".runlog/artifacts",
        artifact_inline_bytes=_int(e, "RUNLOG_ARTIFACT_INLINE_BYTES", 512),
        lease_ttl_ms=_int(e, "RUNLOG_LEASE_TTL_MS", 15_000),
        max_record_bytes=_int(e, "RUNLOG_MAX_RECORD_BYTES", 1_000_000),
        metrics_port=_int(e, "RUNLOG_METRICS_PORT", 9464),
        metrics_host=(e.get("RUNLOG_METRICS_HOST") or "127.0.0.1").strip(),
        kafka_extra=extra,
        redis_username=e.get("RUNLOG_REDIS_USERNAME") or None,
        redis_password=e.get("RUNLOG_REDIS_PASSWORD") or None,
        redis_ssl_ca_certs=e.get("RUNLOG_REDIS_SSL_CA_CERTS") or None,
        redis_ssl_ca_pem=e.get("RUNLOG_REDIS_SSL_CA_PEM") or None,
        redis_ssl_certfile=e.get("RUNLOG_REDIS_SSL_CERTFILE") or None,
        redis_ssl_keyfile=e.get("RUNLOG_REDIS_SSL_KEYFILE") or None,
        redis_ssl_key_password=e.get("RUNLOG_REDIS_SSL_KEY_PASSWORD") or None,
        redis_ssl_check_hostname=_bool(e, "RUNLOG_REDIS_SSL_CHECK_HOSTNAME", True),
        redis_failover_ms=_int(e, "RUNLOG_REDIS_FAILOVER_MS", 20_000),
        redis_wait_replicas=_replicas(e, "RUNLOG_REDIS_WAIT_REPLICAS"),
        redis_wait_ms=_int(e, "RUNLOG_REDIS_WAIT_MS", 2000),
        demo_world_url=e.get("RUNLOG_DEMO_WORLD_URL") or None,
        resumer_group=e.get("RUNLOG_RESUMER_GROUP") or "runlog-resumer",
        sweep_interval_ms=_int(e, "RUNLOG_SWEEP_INTERVAL_MS", 5000),
        limit_durable_wait_ms=_int(e, "RUNLOG_LIMIT_DURABLE_WAIT_MS", 2000),
        startup_wait_ms=_int(e, "RUNLOG_STARTUP_WAIT_MS", 60_000),
        group_instance_id=e.get("RUNLOG_GROUP_INSTANCE_ID", "").strip() or None,
        fault_report=e.get("RUNLOG_FAULT_REPORT") or ".runlog/reports/faults.json",
        console_token=e.get("RUNLOG_CONSOLE_TOKEN") or None,
        tracing=_bool(e, "RUNLOG_TRACING", True),
        encryption=_bool(e, "RUNLOG_ENCRYPTION", False),
        keyring=e.get("RUNLOG_KEYRING") or ".runlog/keyring",
        default_subject=(e.get("RUNLOG_DEFAULT_SUBJECT") or "default").strip() or "default",
        key_provider=_key_provider(e.get("RUNLOG_KEY_PROVIDER") or "local"),
        transit_addr=(e.get("RUNLOG_TRANSIT_ADDR") or "").strip() or None,
        transit_mount=(e.get("RUNLOG_TRANSIT_MOUNT") or "transit").strip("/ ") or "transit",
        transit_key=(e.get("RUNLOG_TRANSIT_KEY") or "runlog").strip() or "runlog",
        transit_token=e.get("RUNLOG_TRANSIT_TOKEN") or None,
    )


def _key_provider(raw: str) -> str:
    value = raw.strip().lower()
    if value not in ("local", "transit"):
        raise ConfigError(f"RUNLOG_KEY_PROVIDER must be local or transit, got {raw!r}")
    return value


def env_from_values(f: Mapping[str, Any]) -> dict[str, str]:
    """The variables that give the field values ``f`` back (:func:`values_from_env`'s inverse)."""
    env: dict[str, str] = {
        "KAFKA_BOOTSTRAP_SERVERS": f["kafka_bootstrap_servers"],
        "REDIS_URL": f["redis_url"],
        "RUNLOG_TOPIC_PREFIX": f["topic_prefix"],
        "RUNLOG_REDIS_PREFIX": f["redis_prefix"],
        "RUNLOG_PARTITIONS": str(f["partitions"]),
        "RUNLOG_REPLICATION_FACTOR": str(f["replication_factor"]),
        "RUNLOG_MIN_INSYNC_REPLICAS": str(f["min_insync_replicas"]),
        "RUNLOG_EVENTS_RETENTION_MS": str(f["events_retention_ms"]),
        "RUNLOG_STREAMS_RETENTION_MS": str(f["streams_retention_ms"]),
        "RUNLOG_ARTIFACT_ROOT": f["artifact_root"],
        "RUNLOG_ARTIFACT_INLINE_BYTES": str(f["artifact_inline_bytes"]),
        "RUNLOG_LEASE_TTL_MS": str(f["lease_ttl_ms"]),
        "RUNLOG_MAX_RECORD_BYTES": str(f["max_record_bytes"]),
        "RUNLOG_METRICS_PORT": str(f["metrics_port"]),
        "RUNLOG_METRICS_HOST": f["metrics_host"],
        "RUNLOG_RESUMER_GROUP": f["resumer_group"],
        "RUNLOG_SWEEP_INTERVAL_MS": str(f["sweep_interval_ms"]),
        "RUNLOG_LIMIT_DURABLE_WAIT_MS": str(f["limit_durable_wait_ms"]),
        "RUNLOG_STARTUP_WAIT_MS": str(f["startup_wait_ms"]),
        "RUNLOG_FAULT_REPORT": f["fault_report"],
        "RUNLOG_REDIS_SSL_CHECK_HOSTNAME": "true" if f["redis_ssl_check_hostname"] else "false",
        "RUNLOG_REDIS_FAILOVER_MS": str(f["redis_failover_ms"]),
        "RUNLOG_REDIS_WAIT_REPLICAS": "auto" if f["redis_wait_replicas"] is None
        else str(f["redis_wait_replicas"]),
        "RUNLOG_REDIS_WAIT_MS": str(f["redis_wait_ms"]),
        "RUNLOG_SCHEMA_REGISTRY_AUTO_REGISTER": "true" if f["schema_registry_auto_register"] else "false",
        "RUNLOG_TRACING": "true" if f["tracing"] else "false",
        "RUNLOG_ENCRYPTION": "true" if f["encryption"] else "false",
        "RUNLOG_KEYRING": f["keyring"],
        "RUNLOG_DEFAULT_SUBJECT": f["default_subject"],
        "RUNLOG_KEY_PROVIDER": f["key_provider"],
        "RUNLOG_TRANSIT_MOUNT": f["transit_mount"],
        "RUNLOG_TRANSIT_KEY": f["transit_key"],
    }
    optional = {
        "RUNLOG_SCHEMA_REGISTRY_URL": f["schema_registry_url"],
        "RUNLOG_DEMO_WORLD_URL": f["demo_world_url"],
        "RUNLOG_REDIS_USERNAME": f["redis_username"],
        "RUNLOG_REDIS_PASSWORD": f["redis_password"],
        "RUNLOG_REDIS_SSL_CA_CERTS": f["redis_ssl_ca_certs"],
        "RUNLOG_REDIS_SSL_CA_PEM": f["redis_ssl_ca_pem"],
        "RUNLOG_REDIS_SSL_CERTFILE": f["redis_ssl_certfile"],
        "RUNLOG_REDIS_SSL_KEYFILE": f["redis_ssl_keyfile"],
        "RUNLOG_REDIS_SSL_KEY_PASSWORD": f["redis_ssl_key_password"],
        "RUNLOG_CONSOLE_TOKEN": f["console_token"],
        "RUNLOG_TRANSIT_ADDR": f["transit_addr"],
        "RUNLOG_TRANSIT_TOKEN": f["transit_token"],
        "RUNLOG_GROUP_INSTANCE_ID": f["group_instance_id"],
        "RUNLOG_SCHEMA_VERSION": None if f["schema_version"] is None else str(f["schema_version"]),
    }
    env.update({k: v for k, v in optional.items() if v})
    for key, value in f["kafka_extra"].items():
        env[kafka_env_name(key)] = value
    for key, value in f["schema_registry_extra"].items():
        env["RUNLOG_SCHEMA_REGISTRY_" + key.upper().replace(".", "_")] = value
    return env
