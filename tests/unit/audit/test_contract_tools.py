"""The contract as other services' tools read it: ``@asyncapi/parser`` gets complete payload and header
schemas, every ``.avsc`` file parses on its own with avsc (same canonical form and fingerprint as the
codec's), and the CloudEvents headers the document names are the ones the writer sets."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastavro.schema import fingerprint, to_parsing_canonical_form

from runlog.producers.log import _cloudevents as ce
from runlog.schemas import Codec, EventType, load_past_schemas, load_schema
from tests.unit.audit.asyncapi_payloads import AVSC_FILES, DOC, SCHEMAS, avro_to_json_schemas
from tests.unit.audit.node_tools import NodeTools

AVRO = SCHEMAS / "avro"
RECORD_FILES = {"runlog.RunEvent": "run_event.avsc", "runlog.Checkpoint": "checkpoint.avsc",
                "runlog.Effect": "effect.avsc", "runlog.ResumeRequest": "resume_request.avsc",
                "runlog.StreamRecord": "stream_record.avsc", "runlog.RunSubmission": "run_submission.avsc"}
FINGERPRINTS = {  # part of the wire format: single-object values start with these (little-endian hex)
    "run_event.avsc": "f34cf1b192e8baa4",
    "run_event.v1.avsc": "1aebfbaadf2ee791",
    "run_event.v2.avsc": "66a270337b3e0467",
    "run_event.v3.avsc": "5bdea74cdcbde605",
    "run_event.v4.avsc": "6f5c0ff9c364832e",
    "checkpoint.avsc": "2b630c062e741e1a",
    "effect.avsc": "bb092aec091ca42f",
    "resume_request.avsc": "8fdf50d9c39d5c82",
    "resume_request.v1.avsc": "7d61ec488ed95419",
    "stream_record.avsc": "e41cea1479ff0ac5",
    "run_submission.avsc": "cec9c3cf9a7286d1",
    "artifact_ref.avsc": "d773c9888d752f21",
    "rule_result.avsc": "77207793ed8eda22",
}
ARTIFACT_REF = {
    "type": "object", "title": "runlog.ArtifactRef", "required": ["uri", "sha256", "size"],
    "properties": {"uri": {"type": "string"}, "sha256": {"type": "string"},
                   "size": {"type": "integer", "format": "int64"},
                   "media_type": {"type": "string", "default": "application/octet-stream"}},
}
RULE_RESULT = {
    "type": "object", "title": "runlog.RuleResult", "required": ["rule", "passed"],
    "properties": {"rule": {"type": "string"}, "passed": {"type": "boolean"},
                   "detail": {"type": ["null", "string"], "default": None}},
}


def doc() -> dict[str, Any]:
    d: dict[str, Any] = json.loads(DOC.read_text(encoding="utf-8"))
    return d


def avsc(name: str) -> dict[str, Any]:
    d: dict[str, Any] = json.loads((AVRO / name).read_text(encoding="utf-8"))
    return d


def plain(node: Any) -> Any:
    """A parsed schema without the parser's bookkeeping (``x-parser-*``)."""
    if isinstance(node, dict):
        return {k: plain(v) for k, v in node.items() if not k.startswith("x-parser-")}
    if isinstance(node, list):
        return [plain(v) for v in node]
    return node


def deref(node: Any, root: dict[str, Any]) -> Any:
    """``node`` with every local ``$ref`` replaced by what it names (the schemas have no cycles)."""
    if isinstance(node, dict):
        if set(node) == {"$ref"} and node["$ref"].startswith("#/"):
            target: Any = root
            for part in node["$ref"][2:].split("/"):
                target = target[part]
            return deref(target, root)
        return {k: deref(v, root) for k, v in node.items()}
    if isinstance(node, list):
        return [deref(v, root) for v in node]
    return node


def subset(expected: dict[str, Any], got: dict[str, Any]) -> bool:
    return all(k in got and (subset(v, got[k]) if isinstance(v, dict) else got[k] == v)
               for k, v in expected.items())


def named_definitions(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        if node.get("type") in ("record", "enum", "fixed"):
            yield node
        for v in node.values():
            yield from named_definitions(v)
    elif isinstance(node, list):
        for v in node:
            yield from named_definitions(v)


@pytest.fixture(scope="module")
def node() -> NodeTools:
    return NodeTools.install()


@pytest.fixture(scope="module")
def parsed(node: NodeTools) -> dict[str, Any]:
    out: dict[str, Any] = node.run("asyncapi_parse.cjs", str(DOC))
    return out


# -- the document -----------------------------------------------------------------------------------


def test_payloads_are_the_avsc_files_in_json_schema() -> None:
    d = doc()
    assert d["components"]["schemas"] == avro_to_json_schemas(), \
        "stale: python -m tests.unit.audit.asyncapi_payloads rewrites them from the .avsc files"
    for name, f in RECORD_FILES.items():
        msg = d["components"]["messages"][name.removeprefix("runlog.")]
        assert msg["payload"] == {"$ref": f"#/components/schemas/{name}"}
        assert msg["x-avro-schema"]["schema"] == {"$ref": f"./avro/{f}"}
        assert msg["contentType"] == "application/avro"
    assert set(AVSC_FILES) == set(RECORD_FILES.values())


def test_the_documented_headers_are_the_writers() -> None:
    msgs = doc()["components"]["messages"]
    run = msgs["RunEvent"]["headers"]
    names = ["ce_specversion", "ce_id", "ce_source", "ce_type", "ce_time", "ce_subject", "content-type"]
    assert list(run["properties"]) == names and run["required"] == names
    assert run["properties"]["ce_specversion"]["const"] == ce.SPECVERSION
    assert run["properties"]["ce_type"]["enum"] == [ce.RUN_EVENT_TYPE_PREFIX + t.value for t in EventType]
    framings = [ce.CONTENT_TYPE_SINGLE_OBJECT, ce.CONTENT_TYPE_REGISTRY]
    assert run["properties"]["content-type"]["enum"] == framings
    resume = msgs["ResumeRequest"]["headers"]
    assert list(resume["properties"]) == names
    assert resume["properties"]["ce_type"]["const"] == ce.RESUME_REQUEST_TYPE
    assert resume["properties"]["content-type"]["enum"] == framings


# -- the .avsc files ----------------------------------------------------------------------------------


def test_each_avsc_file_is_self_contained_and_keeps_its_fingerprint() -> None:
    import fastavro

    for f, fp in FINGERPRINTS.items():
        schema = avsc(f)
        fastavro.parse_schema(schema, named_schemas={})  # nothing else loaded: every name defined here
        assert fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO") == fp, f
    codec = Codec()
    for name, f in RECORD_FILES.items():
        assert load_schema(name) == avsc(f)  # what the codec writes with is the file as it stands
        assert codec.fingerprint(name).hex() == FINGERPRINTS[f]
    assert load_past_schemas("runlog.RunEvent") == [avsc("run_event.v1.avsc"), avsc("run_event.v2.avsc"),
                                                    avsc("run_event.v3.avsc"), avsc("run_event.v4.avsc")]
    assert load_past_schemas("runlog.ResumeRequest") == [avsc("resume_request.v1.avsc")]


def test_shared_types_are_defined_alike_wherever_they_are_defined() -> None:
    shared = {f"runlog.{avsc(f)['name']}": avsc(f) for f in ("artifact_ref.avsc", "rule_result.avsc")}
    seen: dict[str, list[str]] = {}
    for f in [*RECORD_FILES.values(), "run_event.v1.avsc", "run_event.v2.avsc", "run_event.v3.avsc",
              "run_event.v4.avsc"]:
        for d in named_definitions(avsc(f)):
            full = d["name"] if "." in d["name"] else f"{d.get('namespace', 'runlog')}.{d['name']}"
            if full in shared:
                assert d == shared[full], (f, full)
                seen.setdefault(full, []).append(f)
    past = ["run_event.v1.avsc", "run_event.v2.avsc", "run_event.v3.avsc", "run_event.v4.avsc"]
    assert seen == {"runlog.ArtifactRef": ["run_event.avsc", "checkpoint.avsc", *past],
                    "runlog.RuleResult": ["run_event.avsc", "checkpoint.avsc", *past]}


def test_each_avsc_file_parses_on_its_own_with_avsc(node: NodeTools) -> None:
    files = sorted(AVRO.glob("*.avsc"))
    assert {p.name for p in files} == set(FINGERPRINTS)
    out = node.run("avsc_parse.cjs", *map(str, files))
    for p in files:
        res = out[str(p)]
        assert "error" not in res, (p.name, res)
        schema = avsc(p.name)
        assert res["name"] == f"{schema['namespace']}.{schema['name']}"
        # avsc's canonical form is the Avro parsing canonical form the fingerprint hashes
        assert res["canonical"] == to_parsing_canonical_form(schema), p.name
        assert fingerprint(res["canonical"], "CRC-64-AVRO") == FINGERPRINTS[p.name]


# -- what @asyncapi/parser gives ----------------------------------------------------------------------


def test_asyncapi_parser_accepts_the_document(parsed: dict[str, Any]) -> None:
    problems = [d for d in parsed["diagnostics"] if d["severity"] <= 1]  # 0 error, 1 warning
    assert problems == []
    assert set(parsed["messages"]) == {"RunEvent", "Checkpoint", "Effect", "ResumeRequest", "StreamRecord",
                                       "RunSubmission", "DeadLetter", "WriterSchema", "Schedule"}


def test_asyncapi_parser_resolves_the_shared_types(parsed: dict[str, Any]) -> None:
    msgs = {k: plain(v) for k, v in parsed["messages"].items()}
    run = msgs["RunEvent"]["payload"]["properties"]
    assert subset(ARTIFACT_REF, run["artifact_refs"]["items"]), run["artifact_refs"]
    assert run["artifact_refs"]["type"] == "array"
    assert run["payload_ref"]["oneOf"][0] == {"type": "null"}
    assert subset(ARTIFACT_REF, run["payload_ref"]["oneOf"][1]), run["payload_ref"]
    assert subset(RULE_RESULT, run["verification"]["items"]), run["verification"]
    cp = msgs["Checkpoint"]["payload"]["properties"]
    assert subset(ARTIFACT_REF, cp["artifacts"]["items"]), cp["artifacts"]
    assert subset(RULE_RESULT, cp["verified_by"]["items"]), cp["verified_by"]
    assert run["workflow"]["oneOf"][1]["properties"]["stages"]["items"]["properties"]["checkpoint"] == {
        "type": "boolean", "default": True}
    assert run["type"]["enum"] == [t.value for t in EventType]


def empty_schemas(node: Any, path: str = "") -> Iterator[str]:
    """Where a parsed schema has an empty schema (what an unresolved named type becomes)."""
    if isinstance(node, dict):
        if not node:
            yield path or "/"
        for k, v in node.items():
            if k not in ("default", "examples", "enum", "const"):
                yield from empty_schemas(v, f"{path}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from empty_schemas(v, f"{path}/{i}")


def test_asyncapi_parser_payloads_are_complete(parsed: dict[str, Any]) -> None:
    d = doc()
    for name in RECORD_FILES:
        got = plain(parsed["messages"][name.removeprefix("runlog.")])
        assert got["payload"] == deref(d["components"]["schemas"][name], d), name  # every $ref resolved
        assert list(empty_schemas(got["payload"])) == [], name
        assert got["avro"]["schema"] == avsc(RECORD_FILES[name]), name  # and the full Avro schema beside it


def test_asyncapi_parser_gives_the_headers(parsed: dict[str, Any]) -> None:
    msgs = doc()["components"]["messages"]
    for name in ("RunEvent", "ResumeRequest"):
        assert plain(parsed["messages"][name]["headers"]) == msgs[name]["headers"]
    assert parsed["messages"]["RunEvent"]["contentType"] == "application/avro"


def test_parsed_avro_schema_parses_with_avsc(node: NodeTools, parsed: dict[str, Any], tmp_path: Path) -> None:
    # a tool that only has the parsed document (no files beside it) still gets a usable Avro schema
    paths = []
    for name in RECORD_FILES:
        p = tmp_path / f"{name}.avsc"
        p.write_text(json.dumps(parsed["messages"][name.removeprefix("runlog.")]["avro"]["schema"]))
        paths.append(str(p))
    out = node.run("avsc_parse.cjs", *paths)
    for name, path in zip(RECORD_FILES, paths, strict=True):
        assert out[path].get("name") == name, out[path]
