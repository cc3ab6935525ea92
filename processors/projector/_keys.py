"""Which librdkafka settings (``RUNLOG_KAFKA_*``) the projector's Kafka client honours
(:data:`HONOURED`), deliberately leaves out (:data:`NOT_SECURITY`) and refuses, with the reason
when it is known (:data:`REFUSED`); :func:`check_keys` applies the lists, and the refusals name
the environment variable (:func:`env_name`)."""

from __future__ import annotations

from collections.abc import Mapping

from runlog.schemas.errors import ConfigError
from runlog.schemas.internal import kafka_env_name as env_name

__all__ = ["GSSAPI", "HONOURED", "KEYSTORE_PEM", "NOT_SECURITY", "REFUSED", "check_keys", "env_name",
           "failed", "flag", "refuse"]

#: Keys translated for aiokafka (see :func:`runlog.processors.projector._security.broker_credentials` for how
#: each one is applied).
HONOURED = frozenset({
    "security.protocol",
    # TLS: trust, client certificate, verification
    "ssl.ca.location", "ssl.ca.pem", "ssl.crl.location",
    "ssl.certificate.location", "ssl.certificate.pem",
    "ssl.key.location", "ssl.key.pem", "ssl.key.password",
    "ssl.keystore.location", "ssl.keystore.password",
    "ssl.endpoint.identification.algorithm", "enable.ssl.certificate.verification",
    "ssl.cipher.suites",
    # SASL
    "sasl.mechanism", "sasl.mechanisms", "sasl.username", "sasl.password",
    # SASL/OAUTHBEARER with sasl.oauthbearer.method=oidc (client credentials grant)
    "sasl.oauthbearer.method", "sasl.oauthbearer.client.id", "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.client.credentials.client.id", "sasl.oauthbearer.client.credentials.client.secret",
    "sasl.oauthbearer.token.endpoint.url", "sasl.oauthbearer.scope", "sasl.oauthbearer.extensions",
    "sasl.oauthbearer.grant.type", "sasl.oauthbearer.metadata.authentication.type",
    "https.ca.location", "https.ca.pem",
    # identity, not security, but cheap to keep equal: quotas and broker logs name it
    "client.id",
})

#: Non-security librdkafka tunables the projector deliberately does not pass (its aiokafka client has
#: its own batching, timeouts and fetch sizes): producer batching and delivery, consumer fetching and
#: group timing, sockets, metadata refresh, librdkafka's logging and statistics.
NOT_SECURITY = frozenset({
    # producer
    "linger.ms", "queue.buffering.max.ms", "batch.size", "batch.num.messages", "compression.type",
    "compression.codec", "compression.level", "message.timeout.ms", "delivery.timeout.ms",
    "request.timeout.ms", "retries", "message.send.max.retries", "retry.backoff.ms",
    "retry.backoff.max.ms", "queue.buffering.max.messages", "queue.buffering.max.kbytes",
    "sticky.partitioning.linger.ms", "partitioner", "message.max.bytes", "message.copy.max.bytes",
    # consumer
    "fetch.wait.max.ms", "fetch.min.bytes", "fetch.max.bytes", "max.partition.fetch.bytes",
    "fetch.message.max.bytes", "fetch.error.backoff.ms", "fetch.queue.backoff.ms",
    "queued.min.messages", "queued.max.messages.kbytes", "session.timeout.ms",
    "heartbeat.interval.ms", "max.poll.interval.ms", "coordinator.query.interval.ms",
    "auto.commit.interval.ms", "check.crcs", "client.rack",
    # network and metadata
    "socket.timeout.ms", "socket.keepalive.enable", "socket.nagle.disable",
    "socket.send.buffer.bytes", "socket.receive.buffer.bytes", "socket.connection.setup.timeout.ms",
    "connections.max.idle.ms", "reconnect.backoff.ms", "reconnect.backoff.max.ms",
    "receive.message.max.bytes", "max.in.flight.requests.per.connection", "max.in.flight",
    "metadata.max.age.ms", "topic.metadata.refresh.interval.ms", "topic.metadata.refresh.fast.interval.ms",
    "topic.metadata.propagation.max.ms", "metadata.recovery.strategy",
    "metadata.recovery.rebootstrap.trigger.ms", "broker.address.family", "broker.address.ttl",
    "api.version.request.timeout.ms", "allow.auto.create.topics",
    # librdkafka's logging and statistics
    "debug", "log.connection.close", "log.thread.name", "statistics.interval.ms",
})

GSSAPI = ("GSSAPI (Kerberos) is not supported by the projector's Kafka client (aiokafka without a "
           "Kerberos setup); use SCRAM, PLAIN or OAUTHBEARER")
KEYSTORE_PEM = "use PEM files or text (ssl.certificate.*/ssl.key.*) instead"

#: Known security keys the projector cannot honour, with the reason given in the refusal.
REFUSED: dict[str, str] = {
    "ssl.curves.list": "Python's ssl module cannot restrict the TLS groups to a list",
    "ssl.sigalgs.list": "Python's ssl module cannot restrict the TLS signature algorithms",
    "ssl.providers": "OpenSSL providers cannot be loaded through Python's ssl module",
    "ssl.engine.location": "OpenSSL engines cannot be loaded through Python's ssl module",
    "ssl.engine.id": "OpenSSL engines cannot be loaded through Python's ssl module",
    "ssl.ca.certificate.stores": "Windows certificate stores are not read; give ssl.ca.location or "
                                 "ssl.ca.pem",
    "sasl.kerberos.service.name": GSSAPI,
    "sasl.kerberos.principal": GSSAPI,
    "sasl.kerberos.kinit.cmd": GSSAPI,
    "sasl.kerberos.keytab": GSSAPI,
    "sasl.kerberos.min.time.before.relogin": GSSAPI,
    "sasl.oauthbearer.config": "only sasl.oauthbearer.method=oidc with client credentials is supported",
    "enable.sasl.oauthbearer.unsecure.jwt": "the unsecured JWT handler is for development only; "
                                            "use sasl.oauthbearer.method=oidc",
    "sasl.oauthbearer.assertion.algorithm": "the JWT bearer grant is not supported; use client credentials",
    "sasl.oauthbearer.assertion.private.key.file": "the JWT bearer grant is not supported",
    "sasl.oauthbearer.assertion.private.key.passphrase": "the JWT bearer grant is not supported",
    "sasl.oauthbearer.assertion.private.key.pem": "the JWT bearer grant is not supported",
    "sasl.oauthbearer.assertion.file": "the JWT bearer grant is not supported",
    "sasl.oauthbearer.assertion.claim.aud": "the JWT bearer grant is not supported",
    "sasl.oauthbearer.assertion.claim.exp.seconds": "the JWT bearer grant is not supported",
    "sasl.oauthbearer.assertion.claim.iss": "the JWT bearer grant is not supported",
    "sasl.oauthbearer.assertion.claim.jti.include": "the JWT bearer grant is not supported",
    "sasl.oauthbearer.assertion.claim.nbf.seconds": "the JWT bearer grant is not supported",
    "sasl.oauthbearer.assertion.claim.sub": "the JWT bearer grant is not supported",
    "sasl.oauthbearer.assertion.jwt.template.file": "the JWT bearer grant is not supported",
}


def refuse(key: str, why: str) -> ConfigError:
    """The error refusing ``key``: the projector does not start rather than connect differently."""
    return ConfigError(f"the projector cannot honour {env_name(key)} ({key}): {why}; it refuses to start "
                       f"rather than connect differently from the other Kafka clients")


def check_keys(extra: Mapping[str, str]) -> None:
    """Raise :class:`ConfigError` naming the first key that is neither honoured nor a known
    non-security tunable."""
    for key in sorted(extra):
        if key in HONOURED or key in NOT_SECURITY:
            continue
        raise refuse(key, REFUSED.get(key, "not a setting the projector knows how to apply (only the "
                                            "security settings its Kafka client supports, and the "
                                            "tunables listed in runlog.processors.projector._keys, "
                                            "are accepted)"))


def flag(extra: Mapping[str, str], key: str, default: bool) -> bool:
    """A librdkafka boolean (``true``/``false``/``1``/``0``; unset: ``default``)."""
    raw = str(extra.get(key, "")).strip().lower()
    if not raw:
        return default
    if raw in ("true", "1"):
        return True
    if raw in ("false", "0"):
        return False
    raise refuse(key, f"{raw!r} is not true or false")


def failed(key: str, value: str, err: Exception) -> ConfigError:
    """The error for a setting whose value could not be applied."""
    return ConfigError(f"{env_name(key)} ({key}={value}) failed: {err}")
