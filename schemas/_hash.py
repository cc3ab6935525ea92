"""The hash of an event, which links each accepted event to the one before (pure but for the codec's
schema on first use of version 2 without bytes).

Two versions, told apart by the event's own ``hash_version`` field (part of the record, so of the
bytes the hash covers; Avro default 1, so every event written before the field existed reads as 1):

* **version 1** (every event written before version 2): the sha256 (lowercase hex) of a canonical
  JSON text of the event: an object of every field whose value differs from the field's default
  (so a field added later, with a default, leaves the hash of older events unchanged), keys
  sorted, nested records as objects the same way, enums by name, maps sorted by key.
* **version 2** (what Runlog's writers write): the sha256 (lowercase hex) of the record's Avro
  **body** as written: the bytes after the framing (``C3 01`` + 8-byte fingerprint, or ``00`` +
  4-byte schema id; the body is the same under both). A reader hashes the bytes it received
  (:meth:`runlog.schemas.Codec.decode_with_body`), never a re-encoding, so an event written with any
  writer schema (older or newer than the reader's) hashes alike for every reader, and a service
  in another language verifies the chain with one sha256 of the value's bytes after the header.
  Given no body, :func:`event_hash` encodes the event with the *current bundled* schema: the
  bytes a writer with this code writes, so it is right only for an event written with the current
  schema (in-memory paths, tests, the writer's own events); a reader of the log passes the body.

Why a field and not the schema version, a header or the position: the field is inside the hashed
bytes (so changing it breaks the chain like any other edit), survives both framings and any copy of
the value without its headers, and old records read it as 1 through the Avro default. A reader
that meets a version above 2 hashes it as 2 (a chain break then says the reader is too old).

The writer puts the hash of a run's previous accepted event into ``prev_hash``; the fold keeps the
last one (``RunState.last_hash``); the audit recomputes the chain and names the seq where it breaks.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import MISSING, fields
from enum import Enum
from typing import Any

from runlog.schemas._types import RunEvent

__all__ = ["HASH_VERSION", "current_body", "event_hash"]

HASH_VERSION = 2
"""The hash version Runlog's writers write (``RunEvent.hash_version``)."""


_Spec = tuple[tuple[str, Any], ...]
_SPECS: dict[type, _Spec] = {}
_RECORDS: dict[type, Callable[[Any], dict[str, Any]]] = {}
_PLAIN, _ENUM, _RECORD, _MAP, _LIST = range(5)
_KINDS: dict[type, int] = {str: _PLAIN, int: _PLAIN, float: _PLAIN, bool: _PLAIN, type(None): _PLAIN}
_ENCODE = json.JSONEncoder(
    separators=(",", ":"), sort_keys=True, ensure_ascii=False, check_circular=False
).encode
"""``json.dumps`` with these options builds an encoder per call; this one is built once. The values
it encodes are built fresh from frozen records (no cycles), so the circular-reference check (which
does not change the text) is off: it cost about a third of the encoding."""


def _kind(cls: type) -> int:
    """How values of ``cls`` canonicalise, decided once per class."""
    k = _KINDS.get(cls)
    if k is None:
        if issubclass(cls, Enum):
            k = _ENUM
        elif hasattr(cls, "__dataclass_fields__"):
            k = _RECORD
        elif issubclass(cls, Mapping):
            k = _MAP
        elif issubclass(cls, tuple | list):
            k = _LIST
        else:
            k = _PLAIN
        _KINDS[cls] = k
    return k


def _spec(cls: type) -> _Spec:
    """(name, canonical default or MISSING) per field of a dataclass, computed once per class."""
    spec = _SPECS.get(cls)
    if spec is None:
        out = []
        for f in fields(cls):
            if f.default is not MISSING:
                d = _canon(f.default)
            elif f.default_factory is not MISSING:
                d = _canon(f.default_factory())
            else:
                d = MISSING
            out.append((f.name, d))
        spec = _SPECS[cls] = tuple(out)
    return spec


def _value(x: Any) -> Any:
    """``_canon(x)`` for a field's value that is not None, with the frequent kinds first."""
    t = type(x)
    fn = _RECORDS.get(t)
    if fn is not None:
        return fn(x)
    k = _KINDS.get(t)
    if k is None:
        k = _kind(t)
    if k == _PLAIN:
        return x
    if k == _ENUM:
        return x.value
    if k == _MAP:
        return {str(a): v if type(v) is str else _canon(v) for a, v in sorted(x.items())}
    if k == _LIST:
        return [v if type(v) is str else _canon(v) for v in x]
    return _record(x)


def _record_fn(cls: type) -> Callable[[Any], dict[str, Any]]:
    """A function giving a record of ``cls`` as an object of its fields that differ from their
    defaults, generated once per class with the field loop unrolled (keys inserted sorted).

    Per field, exactly what a loop over :func:`_spec` would do: a None value is left out when the
    default is None, else written as null; any other value is canonicalised (str and int inline)
    and left out when it equals (``==``) the canonical default."""
    fn = _RECORDS.get(cls)
    if fn is not None:
        return fn
    ns: dict[str, Any] = {"_value": _value, "MISSING": MISSING}
    lines = ["def _rec(v):", "    out = {}"]
    for i, (name, d) in enumerate(sorted(_spec(cls), key=lambda nd: nd[0])):
        if not name.isidentifier():
            raise TypeError(f"field name {name!r} of {cls!r}")
        ns[f"_d{i}"] = d
        lines.append(f"    x = v.{name}")
        if d is not None:  # MISSING or a non-None default: None is written as null
            lines.append(f"    if x is None: out[{name!r}] = None")
            lines.append("    else:")
        else:
            lines.append("    if x is not None:")
        lines.append("        t = type(x)")
        lines.append("        c = x if t is str or t is int else _value(x)")
        if d is MISSING:
            lines.append(f"        out[{name!r}] = c")
        else:
            lines.append(f"        if not c == _d{i}: out[{name!r}] = c")
    lines.append("    return out")
    exec("\n".join(lines), ns)  # generated from the class's own field names
    made: Callable[[Any], dict[str, Any]] = ns["_rec"]
    _RECORDS[cls] = made
    return made


def _record(v: Any) -> dict[str, Any]:
    """A dataclass as an object of its fields that differ from their defaults."""
    fn = _RECORDS.get(type(v))
    if fn is None:
        fn = _record_fn(type(v))
    return fn(v)


def _canon(v: Any) -> Any:
    k = _kind(type(v))
    if k == _PLAIN:
        return v
    if k == _ENUM:
        return v.value
    if k == _RECORD:
        return _record(v)
    if k == _MAP:
        return {str(a): x if type(x) is str else _canon(x) for a, x in sorted(v.items())}
    return [x if type(x) is str else _canon(x) for x in v]


def event_hash(event: RunEvent, body: bytes | None = None) -> str:
    """sha256 hex of the event by its ``hash_version`` (see the module docstring).

    Args:
        event: the event.
        body: its Avro body as written or received (the value without its framing); used by
            version 2 only. None: version 2 encodes the event with the current bundled schema,
            right only for an event written with the current schema.
    """
    if event.hash_version < 2:
        return hashlib.sha256(_ENCODE(_record(event)).encode("utf-8")).hexdigest()
    return hashlib.sha256(body if body is not None else current_body(event)).hexdigest()


_BODY: list[Callable[[RunEvent], bytes]] = []


def current_body(event: RunEvent) -> bytes:
    """The event's Avro body under the current bundled ``runlog.RunEvent`` schema (no framing): what a
    writer with this code writes after the header. Loads the codec's schema on first use."""
    if not _BODY:
        import sys

        from runlog.schemas._codec import Codec, body_of

        codec = Codec(max_record_bytes=sys.maxsize)  # hashing is not writing: no size limit here

        def body(ev: RunEvent) -> bytes:
            return body_of(codec.encode(ev))

        _BODY.append(body)
    return _BODY[0](event)
