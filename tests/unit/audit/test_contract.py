"""The contract for other services: the AsyncAPI document and the Schema Registry registration."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka.schema_registry import SchemaRegistryClient, ServerConfig

from runlog.schemas import ConfigError, Settings, Topics, load_past_schemas, load_schema
from runlog.schemas.registry import SUBJECTS, register_schemas, registry_client

SCHEMAS = Path(__file__).resolve().parents[3] / "schemas"


def asyncapi() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((SCHEMAS / "asyncapi.yaml").read_text())  # JSON is YAML
    return doc


def resolve(doc: dict[str, Any], ref: str) -> Any:
    node: Any = doc
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return node


def test_asyncapi_is_version_3_and_parses_as_yaml_too() -> None:
    doc = asyncapi()
    assert doc["asyncapi"].startswith("3.")
    # the file is JSON; AsyncAPI tools read it as YAML, and JSON is not quite YAML to a YAML 1.1
    # parser (a tab before a key does not scan, 1e3 is a string, surrogate escapes stay unpaired):
    # both parses must give the same document
    loaded = yaml.safe_load((SCHEMAS / "asyncapi.yaml").read_text())
    assert isinstance(loaded, dict) and loaded == doc


def test_asyncapi_covers_every_topic_with_key_schema_and_config() -> None:
    doc = asyncapi()
    settings = Settings()
    specs = {s.name: s for s in Topics("").specs(settings)}
    channels = {c["address"].replace("{prefix}", ""): c for c in doc["channels"].values()}
    assert set(channels) == set(specs)
    for name, spec in specs.items():
        ch = channels[name]
        assert len(ch["description"]) > 80, name
        conf = ch["bindings"]["kafka"]["topicConfiguration"]
        assert conf["cleanup.policy"] == [spec.config["cleanup.policy"]], name
        if "retention.ms" in spec.config:
            assert str(conf["retention.ms"]) == spec.config["retention.ms"], name
        (msg_ref,) = ch["messages"].values()
        msg = resolve(doc, msg_ref["$ref"])
        assert msg["bindings"]["kafka"]["key"]["description"], name
    ops = {resolve(doc, o["channel"]["$ref"])["address"] for o in doc["operations"].values()}
    assert ops == {c["address"] for c in doc["channels"].values()}


def test_asyncapi_references_every_avsc_file_and_they_exist() -> None:
    doc = asyncapi()
    refs: set[str] = set()
    for msg in doc["components"]["messages"].values():
        avro = msg.get("x-avro-schema")
        if avro is not None:
            assert avro["schemaFormat"].startswith("application/vnd.apache.avro")
            schema = avro["schema"]
            refs.add(schema["$ref"])
            name = json.loads((SCHEMAS / schema["$ref"]).read_text())["name"]
            assert msg["title"] == f"runlog.{name}"
        refs.update(msg.get("x-past-schemas", []))
        refs.update(msg.get("x-shared-schemas", []))
    files = {f"./avro/{p.name}" for p in (SCHEMAS / "avro").glob("*.avsc")}
    assert refs == files
    assert all((SCHEMAS / r).is_file() for r in refs)
    covered = {resolve(doc, m["$ref"])["title"]
               for c in doc["channels"].values() for m in c["messages"].values()}
    assert set(SUBJECTS) <= covered


class RecordingRegistry:
    """confluent-kafka's mock registry keeps no config; record what register_schemas sets."""

    def __init__(self, url: str) -> None:
        self.client = SchemaRegistryClient.new_client({"url": url})
        self.configs: dict[str, ServerConfig] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def set_config(self, subject_name: str | None = None, config: ServerConfig | None = None) -> ServerConfig:
        assert subject_name is not None and config is not None
        self.configs[subject_name] = config
        return config

    def get_config(self, subject_name: str | None = None) -> ServerConfig | None:
        return self.configs.get(subject_name or "")


def test_register_publishes_every_schema_with_backward_compatibility() -> None:
    reg = RecordingRegistry("mock://runlog-register-test")
    done = register_schemas(reg)  # type: ignore[arg-type]
    assert [d.subject for d in done] == ["runlog.RunEvent", "runlog.Checkpoint", "runlog.Effect",
                                         "runlog.ResumeRequest", "runlog.StreamRecord",
                                         "runlog.RunSubmission"]
    assert {s: c.compatibility.value for s, c in reg.configs.items() if c.compatibility} == {
        s: "BACKWARD" for s in SUBJECTS}
    for d in done:
        assert d.compatibility == "BACKWARD"
        registered = reg.client.get_schema(d.schema_id)
        assert json.loads(registered.schema_str) == load_schema(d.subject)
        assert d.version == len(load_past_schemas(d.subject)) + 1
    again = register_schemas(reg)  # type: ignore[arg-type]
    assert [d.schema_id for d in again] == [d.schema_id for d in done]


def test_registry_client_needs_a_url_and_takes_mock() -> None:
    with pytest.raises(ConfigError):
        registry_client(Settings())
    client = registry_client(Settings(schema_registry_url="mock://runlog-client-test"))
    assert register_schemas(client)[0].subject == "runlog.RunEvent"


def test_cli_register(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from runlog.processors.cli import main

    monkeypatch.delenv("RUNLOG_SCHEMA_REGISTRY_URL", raising=False)
    assert main(["schemas", "register"]) == 2
    monkeypatch.setenv("RUNLOG_SCHEMA_REGISTRY_URL", "mock://runlog-cli-test")
    capsys.readouterr()
    assert main(["schemas", "register", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [d["subject"] for d in out] == list(SUBJECTS)
    assert {d["compatibility"] for d in out} == {"BACKWARD"}
