"""Client configuration built from the settings, in one place: librdkafka's (producers, consumers,
admin clients, with pass-through security and its log lines routed to Python logging), the Schema
Registry client's, and redis-py's keyword arguments. :class:`ClientConfig` is a base of
:class:`~runlog.schemas.settings.Settings`, which holds the values these methods read; the results hold
credentials and are never logged."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from runlog.schemas._env import kafka_env_name
from runlog.schemas.errors import ConfigError

__all__ = ["CONSUMER_GUARANTEES", "KAFKA_LOG", "PRODUCER_DEFAULTS", "PRODUCER_GUARANTEES",
           "SCHEMA_REGISTRY_KEYS", "SR_NUMERIC", "ClientConfig", "check_kafka_guarantees",
           "quiet_unreachable_lines"]

PRODUCER_GUARANTEES: dict[str, Any] = {"enable.idempotence": True, "acks": "all",
                                       "partitioner": "murmur2_random"}
"""Settings of Runlog's event producers that carry its guarantees: no acknowledged event lost or
duplicated, and a run's key on the partition Java clients and the projector compute for it."""
PRODUCER_DEFAULTS: dict[str, Any] = {"linger.ms": 5, "compression.type": "lz4", "message.timeout.ms": 120_000}
"""Defaults of Runlog's producers that a ``RUNLOG_KAFKA_<KEY>`` value replaces (a writer's delivery
deadline is ``message.timeout.ms``)."""
CONSUMER_GUARANTEES: dict[str, Any] = {"enable.auto.commit": False, "auto.offset.reset": "earliest",
                                       "isolation.level": "read_committed",
                                       "partition.assignment.strategy": "cooperative-sticky"}
"""Settings of Runlog's group consumers that carry its guarantees: an offset is committed only once
its record is processed, a new group reads from the start, no aborted write is read, and a member
joining or leaving moves only the partitions that change owner (the rebalance callbacks count on
it). ``group.id`` is Runlog's too: groups are named from ``RUNLOG_TOPIC_PREFIX`` and each process's
group option."""
_ALIKE = {"enable.idempotence": {"true", "1"}, "acks": {"all", "-1"}, "enable.auto.commit": {"false", "0"}}
"""The spellings librdkafka takes for the values of the guarantees."""


_WHY = {
    "producers": ("Runlog's event producers", "an acknowledged event must be neither lost nor written twice, "
                  "and a run's events must land on the partition every client computes"),
    "consumers": ("Runlog's consumers", "an offset is committed only once its record is processed, a new "
                  "group reads the log from its start, and a rebalance moves only what changes owner"),
}


def check_kafka_guarantees(kafka_extra: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` naming a ``RUNLOG_KAFKA_<KEY>`` value for one of
    :data:`PRODUCER_GUARANTEES` or :data:`CONSUMER_GUARANTEES` that is not what it must be, or a
    ``group.id`` (``Settings.validate`` asks, so a command stops before it does anything; such a value
    was overwritten without a word)."""
    for kind, guarantees in (("producers", PRODUCER_GUARANTEES), ("consumers", CONSUMER_GUARANTEES)):
        for key, value in guarantees.items():
            given = kafka_extra.get(key)
            want = str(value).lower()
            if given is not None and str(given).strip().lower() not in _ALIKE.get(key, {want}):
                who, why = _WHY[kind]
                raise ConfigError(f"{kafka_env_name(key)}={given}: {who} need {key}={want} ({why}); unset it")
    if kafka_extra.get("group.id") is not None:
        raise ConfigError(f"{kafka_env_name('group.id')}={kafka_extra['group.id']}: Runlog names its "
                          "consumer groups (RUNLOG_TOPIC_PREFIX and each command's group option, such as "
                          "RUNLOG_RESUMER_GROUP or `runlog project --group`); unset it")


#: librdkafka's log lines (every client built from :meth:`ClientConfig.kafka_common`), as Python logging
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


_TRANSIENT = ("Coordinator load in progress", "Not coordinator", "Coordinator not available")
"""A broker that has just started answers these while it loads its coordinators; librdkafka says
``retrying`` and succeeds a moment later, so the line reports no failure."""


def _transient_line(text: str) -> bool:
    return "retrying" in text and any(marker in text for marker in _TRANSIENT)


_SCOPE = ("is a producer property and will be ignored by this consumer instance",
          "is a consumer property and will be ignored by this producer instance")
"""``RUNLOG_KAFKA_<KEY>`` reaches every client, so a producer setting (``linger.ms``) is ignored by the
consumers and a consumer setting (``fetch.wait.max.ms``) by the producers and admin clients, as
meant; librdkafka's ``CONFWARN`` about it reports nothing wrong."""


def _scope_line(text: str) -> bool:
    return "CONFWARN" in text and any(marker in text for marker in _SCOPE)


_UNREACHABLE = ("Connection refused", "Broker transport failure", "brokers are down", "Failed to resolve",
                "Name or service not known", "Connection timed out", "Timed out")
_quiet = {"unreachable": False}


def quiet_unreachable_lines() -> None:
    """Drop librdkafka's lines about a broker it cannot reach (it writes one per reconnect, about
    five a second): the caller reports an unreachable broker itself, once, as
    :class:`~runlog.schemas.errors.LogUnavailable` (the ``runlog`` CLI does, with exit code 3)."""
    _quiet["unreachable"] = True


def _unreachable_line(text: str) -> bool:
    return _quiet["unreachable"] and any(marker in text for marker in _UNREACHABLE)


class _KafkaNoise(logging.Filter):
    """Demotes :func:`_close_time_noise`, :func:`_transient_line` and :func:`_scope_line` lines to
    DEBUG (dropped unless DEBUG is on for the logger), and the lines of an authentication failure
    once it is reported as :class:`~runlog.schemas.errors.AuthenticationFailed`
    (:func:`~runlog.schemas._kafka_auth.auth_failure_line`: librdkafka repeats them at every
    reconnect)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from runlog.schemas._kafka_auth import auth_failure_line  # confluent-kafka is loaded by then

        text = record.getMessage() if record.levelno > logging.DEBUG else ""
        if text and (_close_time_noise(text) or auth_failure_line(text) or _unreachable_line(text)
                     or _transient_line(text) or _scope_line(text)):
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
SR_NUMERIC = frozenset({"timeout", "max.retries", "retries.wait.ms", "retries.max.wait.ms", "cache.capacity",
                         "cache.latest.ttl.sec"})


class ClientConfig:
    """The client configuration methods of :class:`~runlog.schemas.settings.Settings` (the attributes
    below are its fields)."""

    kafka_bootstrap_servers: str
    kafka_extra: Mapping[str, str]
    topic_prefix: str
    schema_registry_url: str | None
    schema_registry_extra: Mapping[str, str]
    redis_url: str
    redis_username: str | None
    redis_password: str | None
    redis_ssl_ca_certs: str | None
    redis_ssl_ca_pem: str | None
    redis_ssl_certfile: str | None
    redis_ssl_keyfile: str | None
    redis_ssl_key_password: str | None
    redis_ssl_check_hostname: bool
    group_instance_id: str | None

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
        itself, as asked. The error callback (:class:`~runlog.schemas._kafka_auth.AuthWatch`) raises
        :class:`~runlog.schemas.errors.AuthenticationFailed` from the call that serves an authentication
        failure (a wrong password, a failed TLS handshake) instead of letting the client retry it
        for ever."""
        from runlog.schemas._kafka_auth import AuthWatch  # deferred: importing schemas loads no Kafka driver

        conf: dict[str, Any] = {"bootstrap.servers": self.kafka_bootstrap_servers}
        if "debug" not in self.kafka_extra:
            conf["logger"] = KAFKA_LOG
        conf.update(self.kafka_extra)
        conf["error_cb"] = AuthWatch(conf)
        return conf

    def producer_config(self, **overrides: Any) -> dict[str, Any]:
        """An idempotent, acks=all producer: no acknowledged event is lost or duplicated.

        :data:`PRODUCER_DEFAULTS` are defaults a ``RUNLOG_KAFKA_<KEY>`` value replaces;
        :data:`PRODUCER_GUARANTEES` are kept whatever is set (``overrides``, from Runlog's own code,
        still apply last: the stream writer's ``acks=1``).

        Raises:
            ConfigError: a ``RUNLOG_KAFKA_<KEY>`` value for one of :data:`PRODUCER_GUARANTEES` that
                is not what it must be (it was ignored without a word).
        """
        check_kafka_guarantees(self.kafka_extra)
        conf = self.kafka_common()
        for key, value in PRODUCER_DEFAULTS.items():
            conf.setdefault(key, value)
        conf.update(PRODUCER_GUARANTEES)
        conf.update(overrides)
        return conf

    def consumer_config(self, group_id: str, **overrides: Any) -> dict[str, Any]:
        """A consumer that commits only what it has processed (at-least-once), in the group
        :meth:`group_id` (``group_id``) names: :data:`CONSUMER_GUARANTEES` are kept whatever is set
        (:meth:`~runlog.schemas.settings.Settings.validate` refuses another value by name);
        ``overrides``, from Runlog's own code, apply last."""
        conf = self.kafka_common()
        conf["group.id"] = self.group_id(group_id)
        conf.update(CONSUMER_GUARANTEES)
        conf.update(overrides)
        return conf

    def member_config(self, group_id: str, overrides: Mapping[str, Any] | None = None, *,
                      defaults: Mapping[str, Any] | None = None,
                      instance_suffix: str = "") -> dict[str, Any]:
        """:meth:`consumer_config` for a long-lived member of a consumer group: with
        ``group.instance.id`` = :attr:`group_instance_id` + ``instance_suffix`` when
        ``RUNLOG_GROUP_INSTANCE_ID`` is set (static membership), else a dynamic member. A process
        with several group consumers gives each its own suffix (the ids must be unique per group).
        ``defaults`` are values a ``RUNLOG_KAFKA_<KEY>`` setting replaces (``overrides`` do not)."""
        conf = self.consumer_config(group_id, **(overrides or {}))
        for key, value in (defaults or {}).items():
            if key not in self.kafka_extra and key not in (overrides or {}):
                conf[key] = value
        if self.group_instance_id is not None:
            conf["group.instance.id"] = self.group_instance_id + instance_suffix
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
            conf[k] = (float(v) if "." in v else int(v)) if k in SR_NUMERIC else v
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
