"""Settings: built from the environment, validated, and never printing a secret."""

from __future__ import annotations

import pytest

from runlog.schemas import ConfigError, Settings, Topics
from runlog.schemas.settings import ENV_VARS


def test_defaults_and_env() -> None:
    s = Settings.from_env({})
    assert s.kafka_bootstrap_servers == "127.0.0.1:19092"
    assert s.partitions == 12
    s = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": "k:1", "RUNLOG_PARTITIONS": "3",
                           "RUNLOG_TOPIC_PREFIX": "prod."})
    assert (s.kafka_bootstrap_servers, s.partitions) == ("k:1", 3)
    assert Topics.of(s).events == "prod.runlog.events"


def test_kafka_passthrough_reaches_every_client_config() -> None:
    s = Settings.from_env({"RUNLOG_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                           "RUNLOG_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
                           "RUNLOG_KAFKA_SASL_USERNAME": "svc",
                           "RUNLOG_KAFKA_SASL_PASSWORD": "hunter2",
                           "RUNLOG_KAFKA_SSL_CA_LOCATION": "/etc/ca.pem"})
    for conf in (s.producer_config(), s.consumer_config("g"), s.admin_config()):
        assert conf["security.protocol"] == "SASL_SSL"
        assert conf["sasl.mechanism"] == "SCRAM-SHA-512"
        assert conf["sasl.password"] == "hunter2"
        assert conf["ssl.ca.location"] == "/etc/ca.pem"
    p = s.producer_config()
    assert p["acks"] == "all" and p["enable.idempotence"] is True


def test_secrets_never_in_repr() -> None:
    s = Settings.from_env({"REDIS_URL": "redis://app:s3cret@db:6379/0",
                           "RUNLOG_KAFKA_SASL_PASSWORD": "hunter2",
                           "RUNLOG_REDIS_PASSWORD": "pw123"})
    text = repr(s)
    for secret in ("s3cret", "hunter2", "pw123"):
        assert secret not in text
    assert "redis://app:***@db:6379/0" in text
    assert s.redis_kwargs()["password"] == "pw123"


@pytest.mark.parametrize(
    "env",
    [{"RUNLOG_PARTITIONS": "many"}, {"RUNLOG_PARTITIONS": "0"},
     {"RUNLOG_MIN_INSYNC_REPLICAS": "2"}, {"REDIS_URL": "http://x"},
     {"RUNLOG_ARTIFACT_INLINE_BYTES": "-1"}, {"RUNLOG_ARTIFACT_INLINE_BYTES": "125001"},
     {"RUNLOG_ARTIFACT_INLINE_BYTES": "small"}],
)
def test_bad_settings_are_config_errors(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        Settings.from_env(env)


def test_every_variable_is_documented_in_the_configuration_reference() -> None:
    """docs/reference/configuration.md as the site shows it (its table generated from ENV_VARS by
    the docs hook): a row per variable with its default and a meaning."""
    from tests.docs._examples import rendered

    page = rendered("reference/configuration.md")
    for name, default, meaning in ENV_VARS:
        assert meaning.strip(), f"{name} has no meaning in ENV_VARS"
        row = next((line for line in page.splitlines() if line.startswith(f"| `{name}` |")), None)
        assert row is not None, f"{name} is not in docs/reference/configuration.md"
        assert (f"`{default}`" if default else "(unset)") in row, row


def test_every_variable_the_code_reads_is_declared() -> None:
    """A variable named in the code but missing from ENV_VARS would be missing from the
    configuration reference too (``RUNLOG_KAFKA_`` stands for ``RUNLOG_KAFKA_<KEY>``)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    declared = {n for n, _, _ in ENV_VARS}
    prefixes = {n.removesuffix("<KEY>") for n in declared if n.endswith("<KEY>")}
    named = {m for pkg in ("schemas", "producers", "processors", "projections")
             for path in (root / pkg).rglob("*.py")
             for m in re.findall(r"[\"'](RUNLOG_[A-Z0-9_]+|KAFKA_BOOTSTRAP_SERVERS|REDIS_URL)[\"']",
                                 path.read_text())}
    assert {"RUNLOG_TOPIC_PREFIX", "REDIS_URL", "RUNLOG_CRASH_AT"} <= named
    undeclared = sorted(n for n in named if n not in declared and n not in prefixes)
    assert not undeclared, f"read by the code, not in ENV_VARS (nor documented): {undeclared}"


def test_topic_specs() -> None:
    s = Settings.from_env({"RUNLOG_REPLICATION_FACTOR": "3", "RUNLOG_MIN_INSYNC_REPLICAS": "2"})
    specs = {t.name: t for t in Topics.of(s).specs(s)}
    assert specs["runlog.checkpoints"].config["cleanup.policy"] == "compact"
    assert specs["runlog.effects"].config["cleanup.policy"] == "compact"
    assert specs["runlog.events"].config["cleanup.policy"] == "delete"
    assert specs["runlog.events"].config["retention.ms"] == "-1"
    assert all(t.replication_factor == 3 and t.config["min.insync.replicas"] == "2"
               for t in specs.values())


def test_to_env_rebuilds_the_same_settings() -> None:
    s = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": "k:9", "REDIS_URL": "redis://u:pw@r:1/2",
                           "RUNLOG_TOPIC_PREFIX": "x.", "RUNLOG_PARTITIONS": "3",
                           "RUNLOG_KAFKA_SASL_MECHANISM": "PLAIN", "RUNLOG_REDIS_PASSWORD": "pw",
                           "RUNLOG_LEASE_TTL_MS": "2500", "RUNLOG_ARTIFACT_INLINE_BYTES": "0"})
    assert s.artifact_inline_bytes == 0 and Settings.from_env({}).artifact_inline_bytes == 512
    assert Settings.from_env(s.to_env()) == s
    assert Settings.from_env(Settings.from_env({}).to_env()) == Settings.from_env({})


def test_group_instance_id_makes_the_resumer_a_static_member() -> None:
    s = Settings.from_env({})
    assert s.group_instance_id is None
    assert "group.instance.id" not in s.member_config("g")
    s = Settings.from_env({"RUNLOG_GROUP_INSTANCE_ID": " resumer-0 ", "RUNLOG_TOPIC_PREFIX": "p."})
    assert s.group_instance_id == "resumer-0"
    conf = s.member_config("g", {"session.timeout.ms": 10_000})
    assert conf["group.instance.id"] == "resumer-0"
    assert conf["group.id"] == "p.g" and conf["session.timeout.ms"] == 10_000
    assert conf["partition.assignment.strategy"] == "cooperative-sticky"
    assert s.member_config("g", instance_suffix=".billing")["group.instance.id"] == "resumer-0.billing"
    # only long-lived members get it: short-lived readers stay dynamic
    assert "group.instance.id" not in s.consumer_config("g")
    assert Settings.from_env(s.to_env()) == s


@pytest.mark.parametrize("bad", ["pod 0", "a/b", "x" * 250])
def test_a_group_instance_id_kafka_refuses_is_a_config_error(bad: str) -> None:
    with pytest.raises(ConfigError, match="RUNLOG_GROUP_INSTANCE_ID"):
        Settings.from_env({"RUNLOG_GROUP_INSTANCE_ID": bad})


def test_producer_tunables_from_the_environment_replace_the_defaults() -> None:
    """RUNLOG_KAFKA_<KEY> is "any librdkafka setting": the producers' linger, compression and delivery
    timeout were set after it and silently won."""
    s = Settings.from_env({"RUNLOG_KAFKA_COMPRESSION_TYPE": "zstd", "RUNLOG_KAFKA_LINGER_MS": "20",
                           "RUNLOG_KAFKA_MESSAGE_TIMEOUT_MS": "30000"})
    p = s.producer_config()
    assert (p["compression.type"], p["linger.ms"], p["message.timeout.ms"]) == ("zstd", "20", "30000")
    assert p["acks"] == "all" and p["enable.idempotence"] is True and p["partitioner"] == "murmur2_random"
    assert s.producer_config(**{"linger.ms": 0})["linger.ms"] == 0  # Runlog's own overrides still last
    d = Settings.from_env({}).producer_config()
    assert (d["compression.type"], d["linger.ms"], d["message.timeout.ms"]) == ("lz4", 5, 120_000)


def test_a_writer_takes_its_delivery_deadline_from_the_environment() -> None:
    from runlog.producers.internal import RunWriter

    writer = RunWriter(Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9",
                                          "RUNLOG_KAFKA_MESSAGE_TIMEOUT_MS": "30000"}))
    try:
        assert writer.delivery_timeout_s == 30.0
    finally:
        writer.close()


@pytest.mark.parametrize(("env", "value"), [("RUNLOG_KAFKA_ACKS", "1"),
                                            ("RUNLOG_KAFKA_ENABLE_IDEMPOTENCE", "false"),
                                            ("RUNLOG_KAFKA_PARTITIONER", "consistent_random")])
def test_a_producer_guarantee_set_otherwise_is_refused_by_name(env: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"{env}={value}: Runlog's event producers need"):
        Settings.from_env({env: value})  # before a command does anything (runlog init made its topics)
    with pytest.raises(ConfigError, match=f"{env}={value}: Runlog's event producers need"):
        Settings(kafka_extra={env[len("RUNLOG_KAFKA_"):].lower().replace("_", "."): value}).producer_config()


@pytest.mark.parametrize(("env", "value"), [("RUNLOG_KAFKA_ENABLE_AUTO_COMMIT", "true"),
                                            ("RUNLOG_KAFKA_AUTO_OFFSET_RESET", "latest"),
                                            ("RUNLOG_KAFKA_ISOLATION_LEVEL", "read_uncommitted"),
                                            ("RUNLOG_KAFKA_PARTITION_ASSIGNMENT_STRATEGY", "range")])
def test_a_consumer_guarantee_set_otherwise_is_refused_by_name(env: str, value: str) -> None:
    """consumer_config overwrote these without a word (a user's RUNLOG_KAFKA_ value did nothing)."""
    with pytest.raises(ConfigError, match=f"{env}={value}: Runlog's consumers need"):
        Settings.from_env({env: value})


def test_a_group_id_is_refused_and_a_consumer_guarantee_set_to_itself_is_accepted() -> None:
    with pytest.raises(ConfigError, match="RUNLOG_KAFKA_GROUP_ID=mine: Runlog names its consumer groups"):
        Settings.from_env({"RUNLOG_KAFKA_GROUP_ID": "mine"})
    s = Settings.from_env({"RUNLOG_KAFKA_ENABLE_AUTO_COMMIT": "false", "RUNLOG_KAFKA_ISOLATION_LEVEL":
                           "READ_COMMITTED", "RUNLOG_TOPIC_PREFIX": "t."})
    c = s.consumer_config("g")
    assert (c["group.id"], c["enable.auto.commit"], c["isolation.level"]) == ("t.g", False, "read_committed")


def test_a_group_members_session_timeout_is_a_default_a_setting_replaces() -> None:
    """The resumer and the worker's intake set session.timeout.ms and max.poll.interval.ms after
    RUNLOG_KAFKA_SESSION_TIMEOUT_MS, which did nothing."""
    defaults = {"session.timeout.ms": 10_000, "max.poll.interval.ms": 600_000}
    assert Settings().member_config("g", defaults=defaults)["session.timeout.ms"] == 10_000
    s = Settings.from_env({"RUNLOG_KAFKA_SESSION_TIMEOUT_MS": "45000"})
    conf = s.member_config("g", defaults=defaults)
    assert (conf["session.timeout.ms"], conf["max.poll.interval.ms"]) == ("45000", 600_000)
    assert s.member_config("g", {"session.timeout.ms": 6000})["session.timeout.ms"] == 6000  # code's own


@pytest.mark.parametrize(("env", "value"), [("RUNLOG_KAFKA_ACKS", "all"), ("RUNLOG_KAFKA_ACKS", "-1"),
                                            ("RUNLOG_KAFKA_ENABLE_IDEMPOTENCE", "true")])
def test_a_producer_guarantee_set_to_itself_is_accepted(env: str, value: str) -> None:
    p = Settings.from_env({env: value}).producer_config()
    assert p["acks"] == "all" and p["enable.idempotence"] is True
