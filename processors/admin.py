"""Topic administration and health checks against the real broker and Redis.

``ensure_topics`` creates Runlog's topics and checks existing ones: a topic that
exists with the right configuration is left alone, one whose configuration
conflicts is reported setting by setting (never silently accepted).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType
from redis.exceptions import RedisClusterException

from runlog.schemas.errors import ConfigError, RunlogError, TopicConfigConflict
from runlog.schemas.internal import is_cluster_url, served
from runlog.schemas.internal import redis_client as _redis_client
from runlog.schemas.settings import Settings
from runlog.schemas.topics import Topics, TopicSpec

__all__ = [
    "RedisModeMismatch",
    "ServiceUnavailable",
    "TopicReport",
    "admin_client",
    "check_kafka",
    "check_kafka_credentials",
    "check_redis",
    "ensure_topics",
    "inspect_topic",
    "probe_kafka",
    "redis_client",
]


class ServiceUnavailable(RunlogError):
    """Kafka or Redis did not answer."""


@dataclass
class TopicReport:
    """What ``ensure_topics`` found or did for one topic."""

    name: str
    action: str  # "created" | "ok" | "conflict" | "missing"
    conflicts: list[TopicConfigConflict] = field(default_factory=list)
    partitions: int | None = None
    replication_factor: int | None = None
    config: dict[str, str] = field(default_factory=dict)


def admin_client(settings: Settings) -> AdminClient:
    return AdminClient(settings.admin_config())


def probe_kafka(settings: Settings, timeout: float = 10.0) -> None:
    """One metadata request, which any client the brokers accept may make: ServiceUnavailable when no
    broker answers within ``timeout`` (AuthenticationFailed when one refuses the credentials)."""
    _topic_metadata(admin_client(settings), timeout, settings.kafka_bootstrap_servers)


def _topic_metadata(admin: AdminClient, timeout: float, bootstrap: str = "") -> dict[str, Any]:
    """Every topic's metadata (``bootstrap``: the servers to name should none answer)."""
    try:
        md = served(admin, lambda t: admin.list_topics(timeout=t), timeout)
    except KafkaException as err:
        where = f" at {bootstrap}" if bootstrap else ""
        raise ServiceUnavailable(f"Kafka{where} did not answer: {err}") from err
    return dict(md.topics)


def inspect_topic(admin: AdminClient, name: str, timeout: float = 10.0) -> TopicReport:
    """Partitions, replication and configuration of an existing topic."""
    return _inspect_topics(admin, [name], timeout)[0]


def _inspect_topics(admin: AdminClient, names: Sequence[str], timeout: float) -> list[TopicReport]:
    """:func:`inspect_topic` of each of ``names``: one metadata request and one ``DescribeConfigs``
    for all of them (``runlog init`` asked both once per topic)."""
    topics = _topic_metadata(admin, timeout)
    found = [n for n in names if n in topics and topics[n].error is None]
    resources = {n: ConfigResource(ResourceType.TOPIC, n) for n in found}
    futures = admin.describe_configs(list(resources.values())) if resources else {}
    reports = []
    for name in names:
        if name not in resources:
            reports.append(TopicReport(name, "missing"))
            continue
        tmd = topics[name]
        rf = min((len(p.replicas) for p in tmd.partitions.values()), default=0)
        try:
            configs = futures[resources[name]].result(timeout)
        except KafkaException as err:
            raise ServiceUnavailable(f"describe_configs({name}) failed: {err}") from err
        reports.append(TopicReport(name, "ok", partitions=len(tmd.partitions), replication_factor=rf,
                                   config={k: str(v.value) for k, v in configs.items()}))
    return reports


def _conflicts(spec: TopicSpec, found: TopicReport) -> list[TopicConfigConflict]:
    out = []
    if found.partitions != spec.partitions:
        out.append(TopicConfigConflict(spec.name, "partitions", str(spec.partitions),
                                       str(found.partitions)))
    if found.replication_factor != spec.replication_factor:
        out.append(TopicConfigConflict(spec.name, "replication.factor",
                                       str(spec.replication_factor), str(found.replication_factor)))
    for key, want in spec.config.items():
        have = found.config.get(key)
        if have != want:
            out.append(TopicConfigConflict(spec.name, key, want, str(have)))
    return out


def _await_leaders(admin: AdminClient, names: set[str], timeout: float) -> None:
    """Wait until every partition of ``names`` has a leader: a topic's creation returns before its
    leaders are elected, and a reader that asks for offsets in between gets NOT_LEADER."""
    deadline = time.monotonic() + timeout
    while True:
        topics = _topic_metadata(admin, timeout)
        waiting = sorted(
            n for n in names
            if n not in topics or topics[n].error is not None or not topics[n].partitions
            or any(p.leader < 0 for p in topics[n].partitions.values())
        )
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise ServiceUnavailable(f"topics {waiting} have partitions without a leader "
                                     f"{timeout:.0f} s after their creation")
        time.sleep(0.05)


def ensure_topics(
    settings: Settings, *, create: bool = True, timeout: float = 30.0
) -> list[TopicReport]:
    """Create missing topics and check existing ones against what Runlog needs.

    Returns one report per topic; conflicts are listed, not raised, so a caller
    can print all of them at once.
    """
    admin = admin_client(settings)
    specs = Topics.of(settings).specs(settings)
    existing = _topic_metadata(admin, timeout)
    to_create = [s for s in specs if s.name not in existing]
    created: set[str] = set()
    if to_create and create:
        futures = admin.create_topics(
            [
                NewTopic(s.name, num_partitions=s.partitions,
                         replication_factor=s.replication_factor, config=dict(s.config))
                for s in to_create
            ],
            operation_timeout=timeout,
        )
        for name, fut in futures.items():
            try:
                fut.result(timeout)
                created.add(name)
            except KafkaException as err:
                kerr = err.args[0] if err.args else None
                if isinstance(kerr, KafkaError) and kerr.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    continue  # a concurrent init made it; it is checked below
                if isinstance(kerr, KafkaError) and kerr.code() in (
                    KafkaError.INVALID_REPLICATION_FACTOR,
                    KafkaError.POLICY_VIOLATION,
                    KafkaError.INVALID_CONFIG,
                ):
                    raise ConfigError(f"cannot create topic {name!r}: {kerr.str()}") from err
                raise ServiceUnavailable(f"creating topic {name!r} failed: {err}") from err
    if created:
        _await_leaders(admin, created, timeout)
    if create:
        from runlog.schemas.internal import publish_bundled_schemas

        publish_bundled_schemas(settings)  # the schema log: a reader of any version finds these
    reports = []
    inspected = iter(_inspect_topics(admin, [s.name for s in specs if s.name not in created], timeout))
    for spec in specs:
        if spec.name in created:
            reports.append(TopicReport(spec.name, "created", partitions=spec.partitions,
                                       replication_factor=spec.replication_factor,
                                       config=dict(spec.config)))
            continue
        found = next(inspected)
        if found.action == "missing":
            reports.append(found)
            continue
        found.conflicts = _conflicts(spec, found)
        if found.conflicts:
            found.action = "conflict"
        reports.append(found)
    return reports


def check_kafka(settings: Settings, timeout: float = 10.0) -> dict[str, Any]:
    """Cluster id, brokers and controller, or ServiceUnavailable."""
    admin = admin_client(settings)
    try:
        md = served(admin, lambda t: admin.list_topics(timeout=t), timeout)
        cluster = admin.describe_cluster(request_timeout=timeout).result(timeout)
    except KafkaException as err:
        raise ServiceUnavailable(f"Kafka at {settings.kafka_bootstrap_servers} did not answer: "
                                 f"{err}") from err
    return {
        "cluster_id": md.cluster_id,
        "brokers": sorted(f"{b.host}:{b.port}" for b in md.brokers.values()),
        "controller_id": cluster.controller.id if cluster.controller else None,
    }


def check_kafka_credentials(settings: Settings, timeout: float = 10.0) -> None:
    """With Kafka security configured (``security.protocol`` other than PLAINTEXT), one metadata request
    with those credentials, for a command that otherwise reads Redis only (``runlog runs``): a wrong
    password is :class:`~runlog.schemas.errors.AuthenticationFailed` (exit 4) as from every other
    command, not a listing that looks fine. Without security there is no credential to refuse: nothing
    is asked (a broker that is down does not keep Redis from being read)."""
    protocol = str(settings.kafka_extra.get("security.protocol") or "PLAINTEXT").upper()
    if protocol == "PLAINTEXT":
        return
    admin = admin_client(settings)
    try:
        served(admin, lambda t: admin.list_topics(Topics.of(settings).events, timeout=t), timeout)
    except KafkaException as err:
        raise ServiceUnavailable(f"Kafka at {settings.kafka_bootstrap_servers} did not answer: "
                                 f"{err}") from err


def redis_client(settings: Settings) -> redis.Redis:
    """A redis-py client configured from settings (AUTH and TLS from the URL or settings; a
    ``RedisCluster`` for a ``redis+cluster://`` URL)."""
    client: redis.Redis = _redis_client(settings)
    return client


def _cluster_info(client: Any) -> dict[str, str]:
    """``CLUSTER INFO`` of one node as text fields."""
    raw = client.execute_command("CLUSTER", "INFO")
    if isinstance(raw, dict):
        return {str(k): str(v) for k, v in raw.items()}
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


class RedisModeMismatch(ServiceUnavailable, ConfigError):
    """REDIS_URL's scheme does not match the server: a standalone URL to a Redis Cluster node, or a
    cluster URL to a standalone server. A configuration error (the ``runlog`` CLI's exit 2; ``runlog
    doctor`` lists it as a problem)."""


def check_redis(settings: Settings, timeout: float = 5.0) -> dict[str, Any]:
    """Redis version and mode (standalone or cluster), or ServiceUnavailable; RedisModeMismatch when
    a ``redis://`` URL names a Redis Cluster node (``INFO cluster`` answers ``cluster_enabled:1``)
    or a ``redis+cluster://`` URL a standalone server."""
    cluster = is_cluster_url(settings.redis_url)
    extra: dict[str, Any] = {"socket_connect_timeout": timeout, "socket_timeout": timeout}
    try:
        client = _redis_client(settings, **extra)
    except (redis.RedisError, RedisClusterException) as err:  # the cluster client connects at once
        if "cluster mode is not enabled" in str(err).lower():
            raise RedisModeMismatch(
                f"REDIS_URL {settings.redacted()['redis_url']} is a redis+cluster:// URL, but the server "
                f"is not a cluster node (cluster mode is not enabled): use redis:// or rediss://") from err
        raise ServiceUnavailable(f"Redis did not answer: {err}") from err
    try:
        if cluster:
            node = client.get_default_node()
            one = client.get_redis_connection(node)
            info = one.info("server")
            persistence = one.info("persistence")
            cinfo = one.info("cluster")
            state = _cluster_info(one)
        else:
            info = client.info("server")
            persistence = client.info("persistence")
            cinfo = client.info("cluster")
    except (redis.RedisError, RedisClusterException) as err:
        raise ServiceUnavailable(f"Redis did not answer: {err}") from err
    finally:
        client.close()
    enabled = int(cinfo.get("cluster_enabled", 0) or 0) == 1
    if not cluster and enabled:
        raise RedisModeMismatch(
            f"REDIS_URL {settings.redacted()['redis_url']} names a Redis Cluster node (INFO cluster: "
            f"cluster_enabled:1), but a redis:// URL makes a standalone client that fails with MOVED on the "
            f"keys other nodes own: use REDIS_URL=redis+cluster://host:port[,host:port...] "
            f"(rediss+cluster:// for TLS)")
    if cluster:
        return {
            "redis_version": info.get("redis_version"),
            "redis_mode": "cluster",
            "aof_enabled": bool(persistence.get("aof_enabled")),
            "cluster_state": state.get("cluster_state"),
            "cluster_known_nodes": int(state.get("cluster_known_nodes", 0) or 0),
            "cluster_size": int(state.get("cluster_size", 0) or 0),
        }
    return {
        "redis_version": info.get("redis_version"),
        "redis_mode": info.get("redis_mode"),
        "aof_enabled": bool(persistence.get("aof_enabled")),
    }
