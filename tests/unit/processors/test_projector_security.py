"""The projector passes Kafka security settings to Faust, never connecting weaker than the rest."""

from __future__ import annotations

import faust
import pytest

from runlog.processors.projector import ProjectorOptions, faust_credentials, faust_settings
from runlog.schemas import ConfigError, Settings


def test_plaintext_has_no_credentials() -> None:
    s = Settings.from_env({})
    assert faust_credentials(s) is None
    assert "broker_credentials" not in faust_settings(s, ProjectorOptions())


def test_sasl_settings_reach_faust() -> None:
    s = Settings.from_env({"RUNLOG_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                           "RUNLOG_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
                           "RUNLOG_KAFKA_SASL_USERNAME": "svc",
                           "RUNLOG_KAFKA_SASL_PASSWORD": "hunter2"})
    creds = faust_settings(s, ProjectorOptions())["broker_credentials"]
    assert isinstance(creds, faust.SASLCredentials)
    assert (creds.username, creds.password) == ("svc", "hunter2")
    assert str(creds.mechanism.value) == "SCRAM-SHA-512"


def test_ssl_builds_a_context() -> None:
    s = Settings.from_env({"RUNLOG_KAFKA_SECURITY_PROTOCOL": "SSL"})
    assert isinstance(faust_credentials(s), faust.SSLCredentials)


def test_unknown_protocol_is_refused() -> None:
    with pytest.raises(ConfigError):
        faust_credentials(Settings.from_env({"RUNLOG_KAFKA_SECURITY_PROTOCOL": "KERBEROS"}))
