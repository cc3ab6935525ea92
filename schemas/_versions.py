"""Runlog's schema versions: which schema of each record a writer pinned to a version writes
(``RUNLOG_SCHEMA_VERSION``), and what a record must not use to be written with it.

A schema version is the number of ``runlog.RunEvent``'s schema (``run_event.v1.avsc`` ...
``run_event.v4.avsc``, then ``run_event.avsc``, version 5), the record whose schema has evolved;
the other records' schemas are those every version from 3 on reads, but ``ResumeRequest``'s, which
a writer pinned to 3 writes as ``resume_request.v1.avsc`` (:data:`_PINNED_FILES`). During a rolling
upgrade the writers are pinned to the oldest version any member of the fleet reads, so every member reads
every record (docs/how-to/upgrade-runlog.md). A record is fitted to the pinned schema before it is
written (:func:`fit`):

* a field the pinned schema lacks is left out when it holds its default (an older reader reads the
  default anyway);
* ``usage`` (version 5), when set, travels in ``attributes`` under :data:`USAGE_ATTRIBUTE` as JSON;
  a reader of version 5 or later puts it back in ``usage`` (:func:`restore`), an older one shows it
  as an attribute: the spend stays a fact on the log;
* anything else (an enum symbol the pinned schema lacks, such as the event type ``RUN_UPGRADED``
  under version 3, or another field set) is refused with :class:`SchemaVersionError`: an older
  reader would read it as ``UNKNOWN`` and miss what it means.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from runlog.schemas.errors import ConfigError, SchemaVersionError

__all__ = [
    "CURRENT_SCHEMA_VERSION",
    "OLDEST_WRITABLE_VERSION",
    "USAGE_ATTRIBUTE",
    "SchemaVersionError",
    "fit",
    "pinned_files",
    "restore",
]

CURRENT_SCHEMA_VERSION = 5
"""The version of the bundled ``run_event.avsc``."""
OLDEST_WRITABLE_VERSION = 3
"""The oldest version a writer may be pinned to: versions 1 and 2 have no ``hash_version``, so
their readers would check this writer's hashes (version 2, over the body bytes) as canonical JSON."""

USAGE_ATTRIBUTE = "runlog.usage"
"""The attribute that carries an event's ``usage`` (compact JSON of its Avro record) when the
writer is pinned below version 5."""

_PINNED_FILES: Mapping[int, Mapping[str, str]] = {
    3: {"runlog.RunEvent": "run_event.v3.avsc", "runlog.ResumeRequest": "resume_request.v1.avsc"},
    4: {"runlog.RunEvent": "run_event.v4.avsc"},
}
"""The records whose schema at a version differs from the current one. ``ResumeRequest`` gained
``seen_epoch`` while the version was 3: the releases of version 3 made before it read only
``resume_request.v1.avsc`` (and have no schema log to look a newer schema up), so a writer pinned to
3 writes that one."""
_DROPPED: Mapping[str, frozenset[str]] = {"runlog.ResumeRequest": frozenset({"seen_epoch"})}
"""Fields :func:`fit` leaves out of a record written with an older schema whatever they hold: an
older reader has no use for them, and a newer one reading the record without them does what it did
before they existed (a resume request without ``seen_epoch`` is not checked for being superseded)."""


def check_version(version: int | None) -> None:
    """Raises :class:`ConfigError` unless ``version`` is None (current) or a version writers can pin."""
    if version is None:
        return
    if not OLDEST_WRITABLE_VERSION <= version <= CURRENT_SCHEMA_VERSION:
        raise ConfigError(f"RUNLOG_SCHEMA_VERSION must be between {OLDEST_WRITABLE_VERSION} and "
                          f"{CURRENT_SCHEMA_VERSION} (the current version), got {version}")


def pinned_files(version: int | None) -> dict[str, str]:
    """Record full name -> the ``.avsc`` file a writer pinned to ``version`` writes, for the records
    whose schema at that version differs from the current one (empty: all current)."""
    check_version(version)
    if version is None or version == CURRENT_SCHEMA_VERSION:
        return {}
    return dict(_PINNED_FILES[version])


def _default_of(field: Mapping[str, Any]) -> Any:
    return field.get("default", _NO_DEFAULT)


_NO_DEFAULT = object()


def fit(record: dict[str, Any], pinned: Mapping[str, Any], current: Mapping[str, Any], version: int,
        record_name: str) -> dict[str, Any]:
    """``record`` (an Avro dict of the ``current`` schema) made writable with the ``pinned`` one.

    Raises:
        SchemaVersionError: it uses a symbol or a field ``pinned`` lacks.
    """
    out = dict(record)
    names = {f["name"] for f in pinned["fields"]}
    for field in current["fields"]:
        name = field["name"]
        if name in names:
            continue
        value = out.pop(name, None)
        if value == _default_of(field) or name in _DROPPED.get(record_name, ()):
            continue
        if name == "usage" and "attributes" in names:
            attrs = dict(out.get("attributes") or {})
            attrs[USAGE_ATTRIBUTE] = json.dumps(value, sort_keys=True, separators=(",", ":"))
            out["attributes"] = attrs
            continue
        raise SchemaVersionError(version, f"field {name!r}", record_name)
    _check_symbols(out, pinned, version, record_name)
    return out


def _enum_symbols(node: Any, out: dict[str, frozenset[str]]) -> None:
    """Every enum of a schema by name (``out``), walking records, unions, arrays and maps."""
    if isinstance(node, list):
        for n in node:
            _enum_symbols(n, out)
    elif isinstance(node, dict):
        kind = node.get("type")
        if kind == "enum":
            out[str(node["name"]).rsplit(".", 1)[-1]] = frozenset(node["symbols"])
        elif kind == "record":
            for f in node["fields"]:
                _enum_symbols(f["type"], out)
        elif kind == "array":
            _enum_symbols(node["items"], out)
        elif kind == "map":
            _enum_symbols(node["values"], out)
        elif isinstance(kind, (dict, list)):
            _enum_symbols(kind, out)


def _check_symbols(record: Mapping[str, Any], pinned: Mapping[str, Any], version: int,
                   record_name: str) -> None:
    """Raises :class:`SchemaVersionError` for a top-level enum value (``type``, ...) or the
    ``replay_policy`` the pinned schema has no symbol for."""
    enums: dict[str, frozenset[str]] = {}
    _enum_symbols(dict(pinned), enums)
    for field in pinned["fields"]:
        ftype = field["type"]
        branches = ftype if isinstance(ftype, list) else [ftype]
        for b in branches:
            if isinstance(b, dict) and b.get("type") == "enum":
                symbols = enums[str(b["name"]).rsplit(".", 1)[-1]]
            elif isinstance(b, str) and b.rsplit(".", 1)[-1] in enums:
                symbols = enums[b.rsplit(".", 1)[-1]]
            else:
                continue
            value = record.get(field["name"])
            if isinstance(value, str) and value not in symbols:
                what = "event type" if field["name"] == "type" else f"{field['name']} symbol"
                raise SchemaVersionError(version, f"{what} {value}", record_name)


def restore(values: dict[str, Any]) -> dict[str, Any]:
    """A decoded ``RunEvent`` dict with the :data:`USAGE_ATTRIBUTE` a pinned writer put in its
    attributes moved back to ``usage`` (unchanged when it has none, or has ``usage`` already)."""
    attrs = values.get("attributes") or {}
    raw = attrs.get(USAGE_ATTRIBUTE)
    if raw is None or values.get("usage") is not None:
        return values
    try:
        usage = json.loads(raw)
    except ValueError:
        return values
    if not isinstance(usage, dict):
        return values
    out = dict(values)
    out["usage"] = usage
    out["attributes"] = {k: v for k, v in attrs.items() if k != USAGE_ATTRIBUTE}
    return out
