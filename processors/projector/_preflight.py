"""What ``runlog project`` checks before Faust starts, so that a misconfiguration is one line and an exit
code instead of the Faust agent's tracebacks and a crash every 10 s (issue 38):

- Redis: ``REDIS_URL`` answers and its scheme matches the server (a ``redis://`` URL to a Redis Cluster
  node, a TLS server whose certificate is not trusted): :func:`runlog.processors.admin.check_redis`,
  the check ``runlog doctor`` makes (exit 3);
- the topics the projector reads and writes exist (``runlog project`` before ``runlog init``):
  :class:`~runlog.schemas.errors.ConfigError` naming them (exit 2);
- the principal may use the projector's consumer group, by its real (prefixed) name: a broker with
  ACLs that grants the topics but not the group answers ``GROUP_AUTHORIZATION_FAILED``, reported as
  :class:`~runlog.schemas.errors.AuthenticationFailed` of kind ``authorization`` (exit 4).
"""

from __future__ import annotations

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from runlog.processors.admin import check_redis
from runlog.schemas.errors import ConfigError, LogUnavailable
from runlog.schemas.internal import awaited, refused, served
from runlog.schemas.settings import Settings
from runlog.schemas.topics import Topics

__all__ = ["check_group", "check_kafka", "check_redis", "check_topics"]

TIMEOUT_S = 10.0


def check_topics(settings: Settings, admin: AdminClient, timeout: float = TIMEOUT_S) -> None:
    """The events topic and the topics the projector publishes to exist.

    Raises:
        ConfigError: one of them does not (``runlog init`` creates them).
        LogUnavailable: the broker did not answer.
    """
    names = Topics.of(settings)
    wanted = [names.events, names.checkpoints, names.effects, names.dlq]
    try:
        md = served(admin, lambda t: admin.list_topics(timeout=t), timeout)
    except KafkaException as err:
        raise LogUnavailable(f"listing the topics failed: {err}") from err
    missing = [t for t in wanted if t not in md.topics or md.topics[t].error is not None]
    if missing:
        many = len(missing) > 1
        raise ConfigError(f"the projector's topic{'s' if many else ''} {', '.join(missing)} "
                          f"{'do' if many else 'does'} not exist on {settings.kafka_bootstrap_servers} "
                          "(create them with `runlog init`, or check RUNLOG_TOPIC_PREFIX)")


def check_group(settings: Settings, admin: AdminClient, group: str, timeout: float = TIMEOUT_S) -> None:
    """The principal may use the consumer group ``group`` (its offsets are read, as the group's
    members do).

    Raises:
        AuthenticationFailed: ``authorization`` of the group refused, naming the group.
    """
    future = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)],
                                               request_timeout=timeout)[group]
    try:
        awaited(admin, future, timeout)
    except KafkaException as err:
        kerr = err.args[0] if err.args else None
        if isinstance(kerr, KafkaError) and kerr.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
            conf = {**settings.kafka_extra, "bootstrap.servers": settings.kafka_bootstrap_servers}
            why = (f"the principal may not use the consumer group {group!r} (grant it READ and DESCRIBE "
                   "on that group: docs/how-to/security.md)")
            raise refused(conf, why, "authorization") from err
        raise LogUnavailable(f"reading the consumer group {group!r} failed: {err}") from err
    except TimeoutError as err:
        raise LogUnavailable(f"reading the consumer group {group!r} took more than {timeout:.0f}s") from err


def check_kafka(settings: Settings, group: str) -> None:
    """The topics, then the group (each failure one typed error)."""
    admin = AdminClient(settings.admin_config())
    check_topics(settings, admin)
    check_group(settings, admin, group)
