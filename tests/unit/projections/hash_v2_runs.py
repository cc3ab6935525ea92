"""Runs whose events carry hash version 2, encoded as records the way a writer writes them, with the
chain computed the way a service outside Runlog verifies it: sha256 of each record's bytes after its
framing (not with :func:`runlog.schemas.event_hash`). Also writers with another version of the schema."""

from __future__ import annotations

import copy
import hashlib
import io
from dataclasses import replace
from typing import Any

import fastavro

from runlog.schemas import SINGLE_OBJECT_MAGIC, Codec, EventType, RunEvent, event_hash, load_schema
from runlog.schemas._avsc import writer_for
from runlog.schemas._mapping import KINDS

T0 = 1_764_000_000_000


def body_sha(data: bytes) -> str:
    """What a Java or kcat reader computes: sha256 of the value after ``C3 01`` + 8 or ``00`` + 4."""
    return hashlib.sha256(data[10:] if data[:2] == SINGLE_OBJECT_MAGIC else data[5:]).hexdigest()


def newer_schema() -> dict[str, Any]:
    """The current RunEvent schema plus a field this code does not know (a newer writer)."""
    s = copy.deepcopy(load_schema("runlog.RunEvent"))
    s["fields"].append({"name": "cost_cents", "type": "long", "default": 0})
    return s


def older_schema() -> dict[str, Any]:
    """The current RunEvent schema without two optional fields (an older writer with version 2)."""
    s = copy.deepcopy(load_schema("runlog.RunEvent"))
    s["fields"] = [f for f in s["fields"] if f["name"] not in ("parent_run_id", "forked_from_seq")]
    return s


def encode_with(codec: Codec, schema: dict[str, Any], ev: RunEvent, **extra: Any) -> bytes:
    """``ev`` single-object encoded with another writer schema (``codec`` learns it)."""
    fp = codec.add_writer_schema(schema)
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, writer_for(schema).parsed, {**KINDS[RunEvent].to_dict(ev), **extra})
    return SINGLE_OBJECT_MAGIC + fp + buf.getvalue()


def event(run_id: str, seq: int, prev: str | None, version: int = 2, **kw: Any) -> RunEvent:
    t = EventType.RUN_STARTED if seq == 1 else EventType.TOOL_CALLED
    base: dict[str, Any] = {"stage": "s", "call_id": f"s/t/{seq}", "tool": "t"} if seq > 1 else {}
    return RunEvent(run_id, seq, 1, t, T0 + seq, prev_hash=prev, hash_version=version, **{**base, **kw})


def chain(run_id: str, n: int, *, codec: Codec | None = None, versions: tuple[int, ...] = (),
          writer: dict[str, Any] | None = None, writer_from: int = 1) -> list[tuple[RunEvent, bytes]]:
    """``n`` chained events with their records: ``versions[i]`` the hash version of seq ``i + 1``
    (2 when not given); from seq ``writer_from`` on written with the schema ``writer`` when given."""
    codec = codec or Codec()
    out: list[tuple[RunEvent, bytes]] = []
    prev: str | None = None
    for seq in range(1, n + 1):
        version = versions[seq - 1] if seq <= len(versions) else 2
        ev = event(run_id, seq, prev, version)
        if writer is not None and seq >= writer_from:
            data = encode_with(codec, writer, ev, cost_cents=7 * seq)  # unknown keys are not written
        else:
            data = codec.encode(ev)
        prev = body_sha(data) if version >= 2 else event_hash(ev)
        out.append((ev, data))
    return out


def edited(ev: RunEvent, **change: Any) -> RunEvent:
    return replace(ev, **change)
