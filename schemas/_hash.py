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


def _default(f: Any) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def _canon(v: Any) -> Any:
    if isinstance(v, Enum):
        return v.value
    if hasattr(v, "__dataclass_fields__"):
        out = {}
        for f in fields(v):
            x = getattr(v, f.name)
            d = _default(f)
            if d is not MISSING and _canon(x) == _canon(d):
                continue
            out[f.name] = _canon(x)
        return out
    if isinstance(v, Mapping):
        return {str(k): _canon(x) for k, x in sorted(v.items())}
    if isinstance(v, tuple | list):
        return [_canon(x) for x in v]
    return v


def event_hash(event: RunEvent) -> str:
    """sha256 hex of the event's canonical content (see the module docstring)."""
    text = json.dumps(_canon(event), separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
