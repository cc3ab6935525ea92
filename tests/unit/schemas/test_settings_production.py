"""Production-shaped settings: group ids under the topic prefix, Redis TLS, librdkafka's log lines,
rebuild's default target inside the key prefix."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace
from typing import Any

import pytest

from runlog.processors.resume import group_id as resumer_group_id
from runlog.projections.rebuild import default_target, prefixes_overlap
from runlog.schemas import ConfigError, Settings
from runlog.schemas.settings import KAFKA_LOG

# -- group ids --------------------------------------------------------------------------------------


def _app(name: str) -> Any:
    return SimpleNamespace(name=name, registry=SimpleNamespace(names=lambda: ["wf"]))


def test_group_ids_carry_the_topic_prefix() -> None:
    s = Settings.from_env({"RUNLOG_TOPIC_PREFIX": "acme."})
    assert s.group_id("runlog-projector") == "acme.runlog-projector"
    assert s.group_id("acme.runlog-projector") == "acme.runlog-projector"  # kept, not doubled
    assert s.consumer_config("runlog-audit-1")["group.id"] == "acme.runlog-audit-1"
    assert resumer_group_id(s, _app("billing")) == "acme.runlog-resumer.billing"


def test_without_a_prefix_group_ids_are_unchanged() -> None:
    s = Settings.from_env({})
    assert s.group_id("runlog-projector") == "runlog-projector"
    assert s.consumer_config("g")["group.id"] == "g"
    assert resumer_group_id(s.with_(resumer_group="rg"), _app("billing")) == "rg.billing"


# -- Redis TLS --------------------------------------------------------------------------------------

TLS_ENV = {
    "REDIS_URL": "rediss://redis.internal:6380/0",
    "RUNLOG_REDIS_SSL_CA_CERTS": "/etc/runlog/redis-ca.pem",
    "RUNLOG_REDIS_SSL_CERTFILE": "/etc/runlog/client.pem",
    "RUNLOG_REDIS_SSL_KEYFILE": "/etc/runlog/client.key",
    "RUNLOG_REDIS_SSL_KEY_PASSWORD": "k3y-s3cret",
    "RUNLOG_REDIS_SSL_CHECK_HOSTNAME": "false",
}


def test_redis_tls_settings_reach_redis_py() -> None:
    kw = Settings.from_env(TLS_ENV).redis_kwargs()
    assert kw["ssl_ca_certs"] == "/etc/runlog/redis-ca.pem"
    assert (kw["ssl_certfile"], kw["ssl_keyfile"]) == ("/etc/runlog/client.pem", "/etc/runlog/client.key")
    assert kw["ssl_password"] == "k3y-s3cret" and kw["ssl_check_hostname"] is False
    inline = Settings.from_env({"REDIS_URL": "rediss://r:6380/0", "RUNLOG_REDIS_SSL_CA_PEM": "-----BEGIN"})
    assert inline.redis_kwargs()["ssl_ca_data"] == "-----BEGIN"
    assert inline.redis_kwargs()["ssl_check_hostname"] is True


def test_redis_py_accepts_the_keyword_arguments() -> None:
    import redis

    s = Settings.from_env({**TLS_ENV, "RUNLOG_REDIS_SSL_KEY_PASSWORD": ""})
    pool = redis.Redis.from_url(s.redis_url, **s.redis_kwargs()).connection_pool
    conn = pool.connection_class(**pool.connection_kwargs)  # built, not connected
    assert isinstance(conn, redis.SSLConnection)
    assert conn.ca_certs == "/etc/runlog/redis-ca.pem" and conn.check_hostname is False
    assert conn.certfile == "/etc/runlog/client.pem" and conn.keyfile == "/etc/runlog/client.key"


def test_plain_redis_gets_no_tls_arguments() -> None:
    kw = Settings.from_env({}).redis_kwargs()
    assert not [k for k in kw if k.startswith("ssl_")]


@pytest.mark.parametrize("name", ["RUNLOG_REDIS_SSL_CA_CERTS", "RUNLOG_REDIS_SSL_CERTFILE",
                                  "RUNLOG_REDIS_SSL_CHECK_HOSTNAME"])
def test_tls_settings_with_a_plain_url_are_refused(name: str) -> None:
    value = "false" if name.endswith("HOSTNAME") else "/x.pem"
    with pytest.raises(ConfigError, match=name):
        Settings.from_env({"REDIS_URL": "redis://r:6379/0", name: value})


def test_bad_redis_tls_settings() -> None:
    with pytest.raises(ConfigError, match="RUNLOG_REDIS_SSL_CHECK_HOSTNAME"):
        Settings.from_env({"REDIS_URL": "rediss://r/0", "RUNLOG_REDIS_SSL_CHECK_HOSTNAME": "perhaps"})
    with pytest.raises(ConfigError, match="RUNLOG_REDIS_SSL_KEYFILE needs"):
        Settings.from_env({"REDIS_URL": "rediss://r/0", "RUNLOG_REDIS_SSL_KEYFILE": "/k.pem"})


def test_redis_tls_round_trips_and_never_prints_the_key_password() -> None:
    s = Settings.from_env({**TLS_ENV, "RUNLOG_TOPIC_PREFIX": "acme.", "RUNLOG_REDIS_SSL_CA_PEM": "PEM"})
    assert Settings.from_env(s.to_env()) == s
    assert "k3y-s3cret" not in repr(s) and "k3y-s3cret" not in str(s.redacted())
    assert "/etc/runlog/redis-ca.pem" in repr(s)  # paths are not secrets


def test_kafka_secrets_of_the_new_kinds_are_masked() -> None:
    s = Settings.from_env({"RUNLOG_KAFKA_SSL_KEY_PEM": "-----BEGIN PRIVATE KEY-----x",
                           "RUNLOG_KAFKA_SSL_KEY_PASSWORD": "kp", "RUNLOG_KAFKA_SSL_KEYSTORE_PASSWORD": "sp",
                           "RUNLOG_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET": "cs",
                           "RUNLOG_KAFKA_SASL_OAUTHBEARER_CONFIG": "principal=x client_secret=cs2"})
    text = repr(s)
    for secret in ("PRIVATE KEY", "kp", "sp", "'cs'", "cs2"):
        assert secret not in text, secret


# -- librdkafka's log lines -------------------------------------------------------------------------


def test_librdkafka_logs_go_to_python_logging_unless_debug_is_asked_for() -> None:
    s = Settings.from_env({})
    for conf in (s.producer_config(), s.consumer_config("g"), s.admin_config()):
        assert conf["logger"] is KAFKA_LOG
    debug = Settings.from_env({"RUNLOG_KAFKA_DEBUG": "broker,security"})
    assert "logger" not in debug.consumer_config("g")
    assert debug.consumer_config("g")["debug"] == "broker,security"


@pytest.fixture(autouse=True)
def _auth_lines_not_yet_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """No authentication failure reported, no quiet CLI (``runlog.processors.cli.main`` run in-process by
    other tests sets it for the rest of the process)."""
    from runlog.schemas import _kafka_auth

    monkeypatch.setitem(_kafka_auth._state, "reported", False)
    monkeypatch.setitem(_kafka_auth._state, "quiet", False)


CLOSE_NOISE = [
    "[thrd:GroupCoordinator]: GroupCoordinator: SASL authentication error: SaslAuthenticateRequest failed: "
    "Local: Broker transport failure (after 0ms in state DOWN)",
    "[thrd:sasl_ssl://k:9093/1]: sasl_ssl://k:9093/1: SASL authentication error: SaslAuthenticateRequest "
    "failed: Local: Broker handle destroyed (after 0ms in state DOWN)",
]
REAL_FAILURE = ("[thrd:sasl_ssl://k:9093/bootstrap]: sasl_ssl://k:9093/bootstrap: SASL authentication error: "
                "Authentication failed during authentication due to invalid credentials with SASL mechanism "
                "SCRAM-SHA-256 (after 11ms in state AUTH_REQ)")


def _log(text: str) -> None:
    # what confluent-kafka's log callback calls: logger.log(level, "%s [%s] %s", fac, name, buf)
    KAFKA_LOG.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", text)


def test_close_time_sasl_noise_is_dropped_and_real_failures_kept(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="librdkafka")
    for text in CLOSE_NOISE:
        _log(text)
    _log(REAL_FAILURE)
    assert [(r.levelname, r.getMessage().split("]: ")[-1][:60]) for r in caplog.records] == [
        ("ERROR", REAL_FAILURE.split("]: ")[-1][:60])]


def test_close_time_noise_is_visible_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="librdkafka")
    _log(CLOSE_NOISE[0])
    assert [r.levelname for r in caplog.records] == ["DEBUG"]


def test_a_fresh_brokers_coordinator_retries_are_debug_and_a_refused_pid_is_kept(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="librdkafka")
    _log("[thrd:main]: Failed to acquire idempotence PID from broker 127.0.0.1:25092/1: Broker: "
         "Coordinator load in progress: retrying")
    _log("[thrd:main]: Failed to acquire idempotence PID from broker 127.0.0.1:25092/1: Broker: "
         "Cluster authorization failed")
    assert [r.levelname for r in caplog.records] == ["DEBUG", "ERROR"]


def test_a_kafka_setting_for_the_other_kind_of_client_is_not_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    """``RUNLOG_KAFKA_<KEY>`` reaches every client: a producer's ``linger.ms`` made each consumer print
    ``CONFWARN ... is a producer property and will be ignored by this consumer instance`` (and a
    consumer's ``fetch.wait.max.ms`` each producer), on every ``runlog`` command."""
    from confluent_kafka import Consumer, Producer

    caplog.set_level(logging.DEBUG, logger="librdkafka")
    s = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", "RUNLOG_KAFKA_LINGER_MS": "10",
                           "RUNLOG_KAFKA_FETCH_WAIT_MAX_MS": "20"})
    consumer = Consumer(s.consumer_config("g"))
    producer = Producer(s.producer_config())
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and sum("property" in r.getMessage() for r in caplog.records) < 2:
            consumer.poll(0.05)
            producer.poll(0.05)
    finally:
        consumer.close()
    scoped = [r for r in caplog.records if "will be ignored by this" in r.getMessage()]
    assert len(scoped) == 2, [r.getMessage() for r in caplog.records]  # librdkafka said it, at DEBUG only
    assert {r.levelname for r in scoped} == {"DEBUG"}, [(r.levelname, r.getMessage()) for r in scoped]


# -- rebuild's default target -----------------------------------------------------------------------


def test_rebuild_default_target_stays_inside_the_key_prefix() -> None:
    s = Settings.from_env({"RUNLOG_REDIS_PREFIX": "tenant"})
    target = default_target(s)
    assert target == "tenant:rebuild" and (target + ":").startswith("tenant:")  # ACL ~tenant:* allows it
    swap = default_target(s, swap=True)
    assert swap == "tenant.rebuild" and not prefixes_overlap("tenant", swap)  # a swap needs a sibling
    live = Settings.from_env({"RUNLOG_REDIS_PREFIX": "tenant:live"})
    assert default_target(live, swap=True).startswith("tenant:")  # the documented ACL layout


# -- a broker refusing the credentials ----------------------------------------------------------------


class _Err:
    """What confluent-kafka hands the error callback (a KafkaError's code() and str())."""

    def __init__(self, code: int, text: str) -> None:
        self._code, self._text = code, text

    def code(self) -> int:
        return self._code

    def str(self) -> str:
        return self._text


def test_the_error_callback_raises_authentication_failed_naming_the_user_not_the_password(
        caplog: pytest.LogCaptureFixture) -> None:
    from confluent_kafka import KafkaError

    from runlog.schemas import _kafka_auth
    from runlog.schemas.errors import AuthenticationFailed

    s = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": "k:9093", "RUNLOG_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                           "RUNLOG_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
                           "RUNLOG_KAFKA_SASL_USERNAME": "svc", "RUNLOG_KAFKA_SASL_PASSWORD": "pw-s3cret"})
    confs = (s.producer_config(), s.consumer_config("g"), s.admin_config())
    cb = confs[0]["error_cb"]
    assert all(isinstance(c["error_cb"], _kafka_auth.AuthWatch) for c in confs)
    # anything else is left to the client, as without a callback
    cb(_Err(KafkaError._TRANSPORT, "k:9093/1: Connection refused"))
    cb(_Err(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    caplog.set_level(logging.INFO, logger="librdkafka")
    _log(REAL_FAILURE)  # the first failure line is still logged (a library user sees it) ...
    with pytest.raises(AuthenticationFailed) as got:
        cb(_Err(KafkaError._AUTHENTICATION, REAL_FAILURE.split("]: ", 1)[1] + " pw-s3cret"))
    err = got.value
    assert str(err).startswith("authentication failed: Kafka at k:9093 refused SASL_SSL SCRAM-SHA-256 "
                               "user 'svc': SASL authentication error: Authentication failed")
    assert "\n" not in str(err) and "pw-s3cret" not in str(err) and "***" in str(err)
    assert (err.broker, err.user, err.mechanism, err.kind) == (
        "k:9093", "svc", "SCRAM-SHA-256", "authentication")
    _log(REAL_FAILURE)  # ... its repeats once it is reported are not
    assert [r.levelname for r in caplog.records] == ["ERROR"]
    for code, kind in ((KafkaError.SASL_AUTHENTICATION_FAILED, "authentication"),
                       (KafkaError._SSL, "authentication"),
                       (KafkaError.TOPIC_AUTHORIZATION_FAILED, "authorization"),
                       (KafkaError.GROUP_AUTHORIZATION_FAILED, "authorization"),
                       (KafkaError.CLUSTER_AUTHORIZATION_FAILED, "authorization")):
        with pytest.raises(AuthenticationFailed, match=f"^{kind} failed: "):
            cb(_Err(code, "x"))


def test_the_cli_drops_even_the_first_failure_line(caplog: pytest.LogCaptureFixture) -> None:
    from runlog.schemas import _kafka_auth

    _kafka_auth.quiet_auth_lines()
    caplog.set_level(logging.INFO, logger="librdkafka")
    _log(REAL_FAILURE)
    _log("[thrd:main]: some other failure")
    assert [r.getMessage().rsplit(": ", 1)[-1] for r in caplog.records] == ["some other failure"]


def test_a_plaintext_client_names_no_mechanism() -> None:
    from confluent_kafka import KafkaError

    from runlog.schemas.errors import AuthenticationFailed

    cb = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": "k:9092"}).admin_config()["error_cb"]
    with pytest.raises(AuthenticationFailed,
                       match=r"^authorization failed: Kafka at k:9092 refused PLAINTEXT: x$"):
        cb(_Err(KafkaError.CLUSTER_AUTHORIZATION_FAILED, "x"))
