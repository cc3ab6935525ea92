"""Canonical JSON and the deterministic keys derived from it (delivery, idempotency, hashes).

Pure: no I/O, no clients. Every hash here is lowercase sha256 hex.

Length-prefixed hashing (:func:`lp_sha256`): each field is UTF-8 encoded and
preceded by its byte length as an 8-byte big-endian unsigned integer, and the
concatenation is hashed. So ``("ab", "c")`` and ``("a", "bc")`` never collide.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from typing import Any

from runlog.schemas.errors import WorkflowDefinitionError

__all__ = [
    "canonical_json",
    "delivery_key",
    "idempotency_key",
    "lp_sha256",
    "sha256_hex",
]


def _check(value: Any, path: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise WorkflowDefinitionError(f"{path}: {value!r} has no canonical JSON form")
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise WorkflowDefinitionError(f"{path}: key {k!r} is not a string")
            _check(v, f"{path}.{k}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _check(v, f"{path}[{i}]")
    elif not (value is None or isinstance(value, str | int | float | bool)):
        raise WorkflowDefinitionError(f"{path}: {type(value).__name__} is not JSON")


def canonical_json(value: Any) -> bytes:
    """UTF-8 JSON with sorted keys, no insignificant whitespace, no NaN/Infinity.

    Equal values always give equal bytes, so their sha256 is a stable identity.
    Tuples encode as arrays. Anything that is not plain JSON data is refused with
    :class:`~runlog.schemas.errors.WorkflowDefinitionError`.
    """
    _check(value, "$")
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def lp_sha256(*fields: str) -> str:
    """sha256 hex over the fields, each as 8-byte big-endian length + UTF-8 bytes."""
    h = hashlib.sha256()
    for f in fields:
        b = f.encode("utf-8")
        h.update(struct.pack(">Q", len(b)))
        h.update(b)
    return h.hexdigest()


def delivery_key(account: str, platform: str, object_id: str, revision: str) -> str:
    """The effect's identity in the outside world (docs/concepts/ledger.md).

    ``lp_sha256(account, platform, object_id, revision)``: scoped by account and
    platform, and a new revision is a new key. ``object_id`` should already be
    canonical (e.g. a slug, not a display title).
    """
    for name, v in (("account", account), ("platform", platform), ("object_id", object_id),
                    ("revision", revision)):
        if not isinstance(v, str) or not v:
            raise WorkflowDefinitionError(f"delivery key field {name} must be a non-empty string")
    return lp_sha256(account, platform, object_id, revision)


def idempotency_key(run_id: str, stage: str, tool: str, index: int, args_sha256: str) -> str:
    """``lp_sha256(run_id, stage, tool, str(index), args_sha256)``: the same call of the same
    run always gets the same key, so an external system can deduplicate a repeat."""
    return lp_sha256(run_id, stage, tool, str(index), args_sha256)
