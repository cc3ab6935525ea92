"""The JSON Schema renderings of the ``.avsc`` files that ``schemas/asyncapi.yaml`` gives as message payloads.

The AsyncAPI Avro schema parser (``@asyncapi/avro-schema-parser`` 3.x) leaves a named type empty
where it is used a second time (``RunEvent.artifact_refs`` after ``payload_ref``), so the document
gives each payload in JSON Schema, every named Avro type one ``components.schemas`` entry keyed by
its full name, and the Avro schema itself beside it (``x-avro-schema``). This module derives those
entries from the ``.avsc`` files (read by path, each one self-contained); the contract test checks
the document against it, and

    python -m tests.unit.audit.asyncapi_payloads

rewrites ``components.schemas`` of the document from the ``.avsc`` files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["AVSC_FILES", "DOC", "avro_to_json_schemas", "main"]

SCHEMAS = Path(__file__).resolve().parents[3] / "schemas"
DOC = SCHEMAS / "asyncapi.yaml"
AVSC_FILES = ("run_event.avsc", "checkpoint.avsc", "effect.avsc", "resume_request.avsc", "stream_record.avsc",
              "run_submission.avsc")
"""The current schema of each record the topics carry (each file defines every named type it uses)."""

_PRIMITIVES: dict[str, dict[str, Any]] = {
    "null": {"type": "null"},
    "boolean": {"type": "boolean"},
    "int": {"type": "integer", "format": "int32"},
    "long": {"type": "integer", "format": "int64"},
    "float": {"type": "number", "format": "float"},
    "double": {"type": "number", "format": "double"},
    "string": {"type": "string"},
}
_LOGICAL = {"timestamp-millis": "milliseconds since 1970-01-01T00:00:00Z (Avro timestamp-millis)"}


def _ref(fullname: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{fullname}"}


def _fullname(name: str, ns: str) -> str:
    return name if "." in name or not ns else f"{ns}.{name}"


def _convert(node: Any, ns: str, defs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    if isinstance(node, str):
        if node in _PRIMITIVES:
            return dict(_PRIMITIVES[node])
        name = _fullname(node, ns)
        if name not in defs:
            raise ValueError(f"{name} is used before it is defined")
        return _ref(name)
    if isinstance(node, list):
        branches = [_convert(n, ns, defs) for n in node]
        if all(b.keys() == {"type"} for b in branches):  # ["null", "string"]: a type list
            return {"type": [b["type"] for b in branches]}
        return {"oneOf": branches}
    if not isinstance(node, dict):
        raise ValueError(f"not an Avro schema: {node!r}")
    kind = node["type"]
    if kind in ("record", "enum"):
        name = _fullname(node["name"], node.get("namespace", ns))
        if name in defs:
            raise ValueError(f"{name} is defined twice")
        inner_ns = name.rpartition(".")[0]
        out: dict[str, Any] = {"title": name}
        if "doc" in node:
            out["description"] = node["doc"]
        defs[name] = out  # before the fields: a record may refer to itself
        if kind == "enum":
            out["type"] = "string"
            out["enum"] = list(node["symbols"])
            if "default" in node:
                out["x-avro-enum-default"] = node["default"]
        else:
            out["type"] = "object"
            props: dict[str, Any] = {}
            required: list[str] = []
            for f in node["fields"]:
                s = _convert(f["type"], inner_ns, defs)
                if "$ref" in s and ("doc" in f or "default" in f):
                    s = {"allOf": [s]}  # keywords beside a $ref are ignored
                if "doc" in f:
                    s["description"] = f["doc"]
                if "default" in f:
                    s["default"] = f["default"]
                else:
                    required.append(f["name"])
                props[f["name"]] = s
            out["properties"] = props
            out["required"] = required
            out["additionalProperties"] = False
        return _ref(name)
    if kind == "array":
        return {"type": "array", "items": _convert(node["items"], ns, defs)}
    if kind == "map":
        return {"type": "object", "additionalProperties": _convert(node["values"], ns, defs)}
    if kind in _PRIMITIVES:
        s = dict(_PRIMITIVES[kind])
        logical = node.get("logicalType")
        if logical is not None:
            s["x-avro-logical-type"] = logical
            if logical in _LOGICAL:
                s["description"] = _LOGICAL[logical]
        return s
    raise ValueError(f"unsupported Avro type {kind!r}")


def avro_to_json_schemas(avro_dir: Path = SCHEMAS / "avro") -> dict[str, dict[str, Any]]:
    """Every named type of the ``AVSC_FILES``, full name -> JSON Schema (``$ref`` s between them).

    A named type several files define (``runlog.ArtifactRef``) must render the same in each.
    """
    out: dict[str, dict[str, Any]] = {}
    for f in AVSC_FILES:
        defs: dict[str, dict[str, Any]] = {}
        _convert(json.loads((avro_dir / f).read_text(encoding="utf-8")), "", defs)
        for name, schema in defs.items():
            if out.setdefault(name, schema) != schema:
                raise ValueError(f"{name} differs between the files that define it ({f})")
    return dict(sorted(out.items()))


def main() -> None:
    doc = json.loads(DOC.read_text(encoding="utf-8"))
    doc["components"]["schemas"] = avro_to_json_schemas()
    DOC.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
