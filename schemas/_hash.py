"""The hash of an event's canonical content, which links each accepted event to the one before (pure).

``event_hash`` is the sha256 (lowercase hex) of a canonical JSON text of the
event: an object of every field whose value differs from the field's default
(so a field added later, with a default, leaves the hash of older events
unchanged), keys sorted, nested records as objects the same way, enums by
name, maps sorted by key. The writer puts the hash of a run's previous accepted
event into ``prev_hash``; the fold keeps the last one (``RunState.last_hash``);
the audit recomputes the chain and names the seq where it breaks.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import MISSING, fields
from enum import Enum
from typing import Any

from schemas._types import RunEvent

__all__ = ["event_hash"]


_Spec = tuple[tuple[str, Any], ...]
_SPECS: dict[type, _Spec] = {}
_PLAIN, _ENUM, _RECORD, _MAP, _LIST = range(5)
_KINDS: dict[type, int] = {str: _PLAIN, int: _PLAIN, float: _PLAIN, bool: _PLAIN, type(None): _PLAIN}
_ENCODE = json.JSONEncoder(separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode
"""``json.dumps`` with these options builds an encoder per call; this one is built once."""


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


def _record(v: Any) -> dict[str, Any]:
    """A dataclass as an object of its fields that differ from their defaults (scalars inline, no call)."""
    out = {}
    for name, d in _spec(type(v)):
        x = getattr(v, name)
        if x is None:
            if d is None:
                continue
            c = None
        else:
            k = _KINDS.get(type(x))
            if k is None:
                k = _kind(type(x))
            c = x if k == _PLAIN else x.value if k == _ENUM else _canon(x)
        if d is not MISSING and c == d:
            continue
        out[name] = c
    return out


def _canon(v: Any) -> Any:
    k = _kind(type(v))
    if k == _PLAIN:
        return v
    if k == _ENUM:
        return v.value
    if k == _RECORD:
        return _record(v)
    if k == _MAP:
        return {str(a): _canon(x) for a, x in sorted(v.items())}
    return [_canon(x) for x in v]


def event_hash(event: RunEvent) -> str:
    """sha256 hex of the event's canonical content (see the module docstring)."""
    return hashlib.sha256(_ENCODE(_record(event)).encode("utf-8")).hexdigest()
