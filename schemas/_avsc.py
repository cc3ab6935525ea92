"""The bundled Avro schemas as the codec uses them: the ``.avsc`` files (``schemas/avro/``) read as
self-contained documents (the shared named types ``runlog.ArtifactRef`` and ``runlog.RuleResult``
inlined at their first use), the earlier versions still read, the CRC-64-AVRO fingerprint of the
Avro specification, and a schema parsed for fastavro with its single-object fingerprint
(:class:`Writer`)."""

from __future__ import annotations

import copy
import json
import struct
from dataclasses import dataclass
from importlib import resources
from typing import Any, cast

import fastavro
from fastavro.schema import to_parsing_canonical_form

from runlog.schemas.errors import ConfigError

__all__ = ["RECORD_FILES", "Writer", "crc64_avro", "load_file", "load_past_schemas", "load_schema",
           "writer_for"]

_CRC64_EMPTY = 0xC15D213AA4D7A795


def _crc64_table() -> list[int]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_CRC64_EMPTY & -(fp & 1))
        table.append(fp)
    return table


_CRC64_TABLE = _crc64_table()


def crc64_avro(data: bytes) -> int:
    """The Rabin CRC-64 fingerprint the Avro specification defines."""
    fp = _CRC64_EMPTY
    for b in data:
        fp = (fp >> 8) ^ _CRC64_TABLE[(fp ^ b) & 0xFF]
    return fp


_SHARED_FILES = ("artifact_ref.avsc", "rule_result.avsc")
RECORD_FILES = {
    "runlog.RunEvent": "run_event.avsc",
    "runlog.Checkpoint": "checkpoint.avsc",
    "runlog.Effect": "effect.avsc",
    "runlog.ResumeRequest": "resume_request.avsc",
    "runlog.StreamRecord": "stream_record.avsc",
    "runlog.RunSubmission": "run_submission.avsc",
}
# Earlier versions of a record's schema, still read (their data is on topics with unlimited retention).
_PAST_FILES: dict[str, tuple[str, ...]] = {
    "runlog.RunEvent": ("run_event.v1.avsc", "run_event.v2.avsc", "run_event.v3.avsc",
                         "run_event.v4.avsc"),
    "runlog.ResumeRequest": ("resume_request.v1.avsc",),
}


def _read_avsc(name: str) -> dict[str, Any]:
    text = resources.files("runlog.schemas").joinpath("avro", name).read_text(encoding="utf-8")
    return cast(dict[str, Any], json.loads(text))


def _inline(node: Any, defs: dict[str, Any], seen: set[str]) -> Any:
    """Replace the first reference to each shared named type with its definition."""
    if isinstance(node, str):
        if node in defs and node not in seen:
            seen.add(node)
            return copy.deepcopy(defs[node])
        return node
    if isinstance(node, list):
        return [_inline(n, defs, seen) for n in node]
    if isinstance(node, dict):
        if "name" in node and node.get("type") in ("record", "enum", "fixed"):
            ns = node.get("namespace", "runlog")
            seen.add(f"{ns}.{node['name']}" if "." not in node["name"] else node["name"])
        out = {}
        for k, v in node.items():
            out[k] = _inline(v, defs, seen) if k in ("type", "fields", "items", "values") else v
        return out
    return node


def _shared_defs() -> dict[str, Any]:
    defs = {}
    for f in _SHARED_FILES:
        d = _read_avsc(f)
        defs[f"{d['namespace']}.{d['name']}"] = d
    return defs


def load_schema(record_name: str) -> dict[str, Any]:
    """A bundled schema as one self-contained JSON document (shared types inlined)."""
    try:
        top = _read_avsc(RECORD_FILES[record_name])
    except KeyError:
        raise ConfigError(f"no bundled schema named {record_name!r}") from None
    return cast(dict[str, Any], _inline(top, _shared_defs(), set()))


def load_file(file: str) -> dict[str, Any]:
    """A bundled ``.avsc`` file (``run_event.v4.avsc``) as one self-contained JSON document."""
    return cast(dict[str, Any], _inline(_read_avsc(file), _shared_defs(), set()))


def load_past_schemas(record_name: str) -> list[dict[str, Any]]:
    """Earlier bundled versions of a record's schema (oldest first), self-contained."""
    return [cast(dict[str, Any], _inline(_read_avsc(f), _shared_defs(), set()))
            for f in _PAST_FILES.get(record_name, ())]


def _strip_logical(node: Any) -> Any:
    """Drop logical types so timestamps stay epoch-millisecond ints in Python."""
    if isinstance(node, list):
        return [_strip_logical(n) for n in node]
    if isinstance(node, dict):
        if "logicalType" in node and node.get("type") in ("long", "int", "bytes", "string"):
            return node["type"]
        return {k: _strip_logical(v) for k, v in node.items() if k != "logicalType"}
    return node


def _fullname(schema: dict[str, Any]) -> str:
    name = str(schema["name"])
    return name if "." in name else f"{schema.get('namespace', '')}.{name}".lstrip(".")


@dataclass(frozen=True)
class Writer:
    """A writer schema: its record's full name, the schema parsed for fastavro, and the 8-byte
    little-endian CRC-64-AVRO fingerprint of its parsing canonical form."""

    record_name: str
    parsed: Any
    fingerprint: bytes


def writer_for(schema: dict[str, Any]) -> Writer:
    """``schema`` parsed (logical types dropped: timestamps stay epoch-millisecond ints) and
    fingerprinted."""
    canonical = to_parsing_canonical_form(schema)
    fp = struct.pack("<Q", crc64_avro(canonical.encode("utf-8")))
    parsed = fastavro.parse_schema(_strip_logical(schema), named_schemas={})
    return Writer(_fullname(schema), parsed, fp)
