"""The Schema Registry mode without a server: ``Codec.from_settings`` with confluent-kafka's
``mock://`` registry, the ``RUNLOG_SCHEMA_REGISTRY_*`` settings, and an unreachable registry
(one line, exit 2, no credential shown). The same paths against a real registry server are in
``tests/integration/schemas/test_registry_mode.py``."""

from __future__ import annotations

import socket
import struct
import uuid
from dataclasses import replace
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from runlog.projections import RawRecord, decode_records
from runlog.schemas import SINGLE_OBJECT_MAGIC, Codec, ConfigError, DecodeError, EventType, RunEvent, Settings
from runlog.schemas.registry import RegistryUnavailable, registry_client, registry_error
from runlog.schemas.settings import ENV_VARS

SECRET = "s3cr3t-pw-42"


def _mock(tag: str = "") -> Settings:
    return Settings(schema_registry_url=f"mock://runlog-mode-{tag}{uuid.uuid4().hex[:8]}")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def _unreachable(**extra: str) -> Settings:
    return Settings.from_env({
        "RUNLOG_SCHEMA_REGISTRY_URL": f"http://runlog:{SECRET}@127.0.0.1:{_closed_port()}",
        "RUNLOG_SCHEMA_REGISTRY_MAX_RETRIES": "0", **extra})


def _event(run: str, seq: int) -> RunEvent:
    t = EventType.RUN_STARTED if seq == 1 else EventType.STAGE_STARTED
    return RunEvent(run, seq, 1, t, 1_764_000_000_000 + seq, stage=None if seq == 1 else "s")


# -- the factory ---------------------------------------------------------------------------------


def test_without_a_registry_the_factory_gives_single_object_codecs() -> None:
    codec = Codec.from_settings(Settings(max_record_bytes=4321))
    assert not codec.uses_registry
    assert codec.encode(_event("r", 1))[:2] == SINGLE_OBJECT_MAGIC
    assert Codec.from_settings(Settings()) is not codec  # nothing shared: unchanged behaviour


def test_with_a_registry_writes_are_registry_framed_and_both_framings_read() -> None:
    s = _mock()
    codec = Codec.from_settings(s)
    assert codec.uses_registry
    assert Codec.from_settings(s) is codec  # one codec (ids and writer schemas cached) per registry
    data = codec.encode(_event("r", 1))
    assert data[0] == 0
    sid = struct.unpack(">I", data[1:5])[0]
    client = registry_client(s)
    assert client.get_latest_version("runlog.RunEvent").schema_id == sid
    single = Codec().encode(_event("r", 2))
    assert codec.decode(data, RunEvent) == _event("r", 1)
    assert codec.decode(single, RunEvent) == _event("r", 2)
    # another reader of the same registry (a fresh codec on the shared client) reads both too
    other = Codec(client)
    assert other.decode(data, RunEvent) == _event("r", 1)
    assert other.decode(single, RunEvent) == _event("r", 2)


def test_a_pinned_schema_version_is_written_with_a_registry_too() -> None:
    """``RUNLOG_SCHEMA_VERSION`` (rolling upgrades: writers stay on the version the oldest reader
    reads) was ignored with ``RUNLOG_SCHEMA_REGISTRY_URL`` set: the registry codec wrote the current
    version whatever the pin said."""
    from runlog.schemas import Usage

    s = replace(_mock("pin"), schema_version=4)
    codec = Codec.from_settings(s)
    assert codec.uses_registry and codec.schema_version == 4
    assert Codec.from_settings(replace(s, schema_version=None)) is not codec  # one codec per pin
    usage = Usage(model="m", input_tokens=7, output_tokens=2, cost_nanos=30)
    data = codec.encode(replace(_event("r", 1), usage=usage))
    sid = struct.unpack(">I", data[1:5])[0]
    written = registry_client(s).get_schema(sid).schema_str
    assert '"usage"' not in written  # version 4's RunEvent: usage travels in attributes
    back = Codec.from_settings(replace(s, schema_version=None)).decode(data, RunEvent)
    assert back.usage == usage and back.run_id == "r"


def test_the_schema_id_is_registered_once() -> None:
    calls: list[str] = []

    class Counting:
        def __init__(self) -> None:
            self.inner = SchemaRegistryClient.new_client({"url": f"mock://count-{uuid.uuid4().hex[:6]}"})

        def register_schema(self, subject_name: str, schema: Any, normalize_schemas: bool = False) -> int:
            calls.append(subject_name)
            return int(self.inner.register_schema(subject_name, schema))

        def get_schema(self, schema_id: int, *args: Any, **kwargs: Any) -> Any:
            calls.append(f"get {schema_id}")
            return self.inner.get_schema(schema_id)

        def lookup_schema(self, subject_name: str, schema: Any, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("auto-register is on")

    registry = Counting()
    codec = Codec(registry)
    encoded = [codec.encode(_event("r", i)) for i in range(1, 6)]
    assert calls == ["runlog.RunEvent"]
    reader = Codec(registry)
    assert [reader.decode(d, RunEvent).seq for d in encoded] == [1, 2, 3, 4, 5]
    assert calls == ["runlog.RunEvent", f"get {struct.unpack('>I', encoded[0][1:5])[0]}"]


def test_the_projector_batch_decode_reads_both_framings_from_one_topic() -> None:
    codec = Codec.from_settings(_mock())
    recs = []
    for off, seq in enumerate(range(1, 7)):
        value = (codec if seq % 2 else Codec()).encode(_event("run-a", seq))
        recs.append(RawRecord("t.runlog.events", 0, off, b"run-a", value))
    good, dead = decode_records(codec, recs)
    assert dead == []
    assert [ev.seq for ev, _, _ in good] == [1, 2, 3, 4, 5, 6]
    assert {r.value[:1] for r in recs} == {b"\x00", b"\xc3"}
    # a reader without the registry: the registry-framed ones are unknown to it (as before)
    good, dead = decode_records(Codec(), recs)
    assert [ev.seq for ev, _, _ in good] == [2, 4, 6]
    assert {d.reason for d in dead} == {"unknown_schema"}


def test_a_version_2_hash_is_the_same_under_both_framings() -> None:
    """The body after ``00`` + schema id is the body after ``C3 01`` + fingerprint: one hash."""
    from runlog.schemas._codec import body_of
    from runlog.schemas._hash import event_hash

    codec = Codec.from_settings(_mock())
    ev = replace(_event("run-a", 2), hash_version=2, prev_hash="ab" * 32)
    framed, single = codec.encode(ev), Codec().encode(ev)
    assert framed[:1] == b"\x00" and single[:2] == SINGLE_OBJECT_MAGIC and framed != single
    assert body_of(framed) == body_of(single) == framed[5:] == single[10:]
    recs = [RawRecord("t.runlog.events", 0, i, b"run-a", v) for i, v in enumerate((framed, single))]
    good, dead = decode_records(codec, recs)
    assert dead == [] and good[0][0] == good[1][0] == ev
    assert good[0][2] == good[1][2] == event_hash(ev, body_of(single)) == event_hash(ev)


def test_without_auto_register_an_unregistered_schema_names_the_command() -> None:
    s = _mock("noauto-").with_(schema_registry_auto_register=False)
    with pytest.raises(ConfigError, match="runlog schemas register"):
        Codec.from_settings(s).encode(_event("r", 1))
    from runlog.schemas.registry import register_schemas

    register_schemas(registry_client(s))
    data = Codec.from_settings(s).encode(_event("r", 1))
    assert data[0] == 0 and Codec.from_settings(s).decode(data, RunEvent) == _event("r", 1)


def test_register_after_a_writer_registered_keeps_the_current_schema_latest() -> None:
    from runlog.schemas.registry import register_schemas

    s = _mock("order-")
    data = Codec.from_settings(s).encode(_event("r", 1))  # a writer registers runlog.RunEvent first
    done = {d.subject: d for d in register_schemas(registry_client(s))}
    latest = registry_client(s).get_latest_version("runlog.RunEvent")
    assert latest.schema_id == done["runlog.RunEvent"].schema_id == struct.unpack(">I", data[1:5])[0]
    assert latest.version == done["runlog.RunEvent"].version == 1


# -- a registry that fails ------------------------------------------------------------------------


def test_an_unreachable_registry_is_one_line_without_the_password() -> None:
    s = _unreachable(RUNLOG_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO="")  # empty: not set
    with pytest.raises(RegistryUnavailable) as err:
        Codec.from_settings(s)
    text = str(err.value)
    assert "\n" not in text and SECRET not in text
    assert "unreachable" in text and "runlog:***@127.0.0.1" in text and "Connect" in text
    assert isinstance(err.value, ConfigError)


def test_a_registry_gone_while_reading_is_not_a_dead_letter() -> None:
    """Only the registry's own "no such id" makes a record undecodable; an outage is raised, so
    the projector, audit, resumer and rebuild stop instead of dead-lettering good records."""
    from confluent_kafka.schema_registry.common._httpx_compat import httpx

    class Down:
        def register_schema(self, *a: Any, **k: Any) -> int:
            raise httpx.ConnectError("[Errno 111] Connection refused")

        def get_schema(self, *a: Any, **k: Any) -> Any:
            raise httpx.ConnectError("[Errno 111] Connection refused")

        def lookup_schema(self, *a: Any, **k: Any) -> Any:
            raise httpx.ConnectError("[Errno 111] Connection refused")

    codec = Codec(Down(), registry_url="http://sr:8081")
    rec = RawRecord("t", 0, 0, b"r", b"\x00\x00\x00\x00\x07\x02")
    with pytest.raises(RegistryUnavailable, match="fetching schema id 7"):
        decode_records(codec, [rec])
    with pytest.raises(RegistryUnavailable, match=r"registering runlog\.RunEvent"):
        codec.encode(_event("r", 1))
    assert codec.decode(Codec().encode(_event("r", 1)), RunEvent).seq == 1  # single-object: no registry


@pytest.mark.parametrize(("status", "kind"), [(401, ConfigError), (403, ConfigError),
                                              (503, RegistryUnavailable), (404, None), (409, None)])
def test_registry_answers_are_mapped(status: int, kind: type[Exception] | None) -> None:
    mapped = registry_error(SchemaRegistryError(status, status * 100, "nope"), "http://sr", "registering x")
    if kind is None:
        assert mapped is None
    else:
        assert type(mapped) is kind and "\n" not in str(mapped)


def test_an_unknown_id_is_still_a_dead_letter_with_a_registry() -> None:
    codec = Codec.from_settings(_mock())
    with pytest.raises(DecodeError) as err:
        codec.decode(b"\x00\x00\x00\x30\x39\x02", RunEvent)
    assert err.value.reason == "unknown_schema"


# -- the CLI ------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["schemas", "register"], ["audit", "--json", "--no-artifacts"]])
def test_cli_with_an_unreachable_registry_prints_one_line_and_exits_2(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str],
        tmp_path: Any) -> None:
    from runlog.processors.cli import main

    monkeypatch.setenv("RUNLOG_SCHEMA_REGISTRY_URL", f"http://runlog:{SECRET}@127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("RUNLOG_SCHEMA_REGISTRY_MAX_RETRIES", "0")
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", f"127.0.0.1:{_closed_port()}")  # never reached
    capsys.readouterr()
    assert main([*argv, "--out", str(tmp_path)] if argv[0] == "audit" else argv) == 2
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("runlog: configuration error: schema registry http://runlog:***@127.0.0.1:")
    assert "unreachable" in lines[0] and SECRET not in err + out


# -- settings -----------------------------------------------------------------------------------


def test_registry_client_settings_pass_through_and_are_masked() -> None:
    env = {"RUNLOG_SCHEMA_REGISTRY_URL": "https://sr.example:8081,https://sr2.example:8081",
           "RUNLOG_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO": f"runlog:{SECRET}",
           "RUNLOG_SCHEMA_REGISTRY_SSL_CA_LOCATION": "/etc/ca.pem",
           "RUNLOG_SCHEMA_REGISTRY_SSL_KEY_PASSWORD": SECRET,
           "RUNLOG_SCHEMA_REGISTRY_TIMEOUT": "7.5", "RUNLOG_SCHEMA_REGISTRY_MAX_RETRIES": "1",
           "RUNLOG_SCHEMA_REGISTRY_AUTO_REGISTER": "false"}
    s = Settings.from_env(env)
    assert s.schema_registry_config() == {
        "url": "https://sr.example:8081,https://sr2.example:8081", "basic.auth.user.info": f"runlog:{SECRET}",
        "ssl.ca.location": "/etc/ca.pem", "ssl.key.password": SECRET, "timeout": 7.5, "max.retries": 1}
    assert s.schema_registry_auto_register is False
    assert SECRET not in repr(s) and SECRET not in str(s.redacted())
    assert s.redacted()["schema_registry_extra"]["ssl.ca.location"] == "/etc/ca.pem"
    assert Settings.from_env(s.to_env()) == s
    masked = Settings(schema_registry_url=f"http://u:{SECRET}@a:1,http://u:{SECRET}@b:2").redacted()
    assert masked["schema_registry_url"] == "http://u:***@a:1,http://u:***@b:2"


@pytest.mark.parametrize("env", [
    {"RUNLOG_SCHEMA_REGISTRY_URL": "http://sr:8081", "RUNLOG_SCHEMA_REGISTRY_BASIC_AUTH_USERINFO": "u:p"},
    {"RUNLOG_SCHEMA_REGISTRY_URL": "http://sr:8081", "RUNLOG_SCHEMA_REGISTRY_TIMEOUT": "soon"},
    {"RUNLOG_SCHEMA_REGISTRY_URL": "sr:8081"},
    {"RUNLOG_SCHEMA_REGISTRY_SSL_CA_LOCATION": "/etc/ca.pem"},
    {"RUNLOG_SCHEMA_REGISTRY_URL": "http://sr:8081", "RUNLOG_SCHEMA_REGISTRY_AUTO_REGISTER": "maybe"},
])
def test_bad_registry_settings_are_config_errors(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        Settings.from_env(env)


def test_a_client_setting_the_client_refuses_is_a_config_error() -> None:
    s = Settings.from_env({"RUNLOG_SCHEMA_REGISTRY_URL": "http://127.0.0.1:1",
                           "RUNLOG_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO": "no-colon"})
    with pytest.raises(ConfigError, match=r"basic\.auth\.user\.info"):
        Codec.from_settings(s)


def test_every_registry_variable_is_listed() -> None:
    names = {n for n, _, _ in ENV_VARS}
    assert {"RUNLOG_SCHEMA_REGISTRY_URL", "RUNLOG_SCHEMA_REGISTRY_AUTO_REGISTER",
            "RUNLOG_SCHEMA_REGISTRY_<KEY>"} <= names
