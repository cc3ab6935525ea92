"""A call's arguments stored by reference: large arguments repeated call after call (a conversation's
messages, a model's tool definitions) are stored once, content-addressed, and the call's recorded
arguments name them by hash.

A tool declared with ``args_by_ref=("messages", ...)`` records, for each argument named there:

* a list as a **hash chain** of its items: one blob per item, ``{"prev": <sha256 of the blob of the
  items before it, or null>, "value": <the item>, "refs": [...]}``. A list's chain is determined by
  the list alone, so a list that grows by appending from call to call (the messages of an agent's
  next model request) shares every blob of the previous call's list and stores only its new items;
  the call names the chain's last blob (``{"chain": <sha256 or null>, "length": n}``);
* anything else as one blob, ``{"value": <the value>, "refs": [...]}`` (``{"blob": <sha256>}``).

Inside those values, every string of at least :data:`BIG_STRING` bytes is a blob of its own (its
JSON text), named by its sha256 at that place and listed in ``refs`` as its path (keys and list
indexes): a long system prompt or instructions repeated in every request message, or the same in
every run, is stored once.

The recorded arguments (the ``TOOL_CALLED`` event's ``payload_ref``, media type
:data:`STORED_ARGS`) are ``{"runlog.stored_args": 1, "args": {<the other arguments>}, "refs": {<name>:
{"chain": ...} or {"blob": ...}}}``. :func:`expand_args` (and :func:`load_args`, from a store) gives
the arguments back exactly: their canonical JSON is the call's, so its sha256 is the call's request
hash, which is computed over the full arguments as for any other call (a run recorded before a
tool stored its arguments by reference replays with the same hashes; a change anywhere in a list,
even in its first item, changes the request hash and the determinism guard sees it).

Blobs are stored before what names them (a string before its item, an item before the next one,
all before the recorded arguments), so every blob a stored argument names exists once it does.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from runlog.producers.base._protocol import Steps
from runlog.producers.calls._artifacts import ArtifactStore
from runlog.producers.calls._calls import JSON
from runlog.producers.calls._keys import canonical_json, sha256_hex
from runlog.producers.calls._stage_artifacts import StageArtifacts
from runlog.producers.define._tools import Tool
from runlog.schemas import ArtifactRef
from runlog.schemas.errors import ArtifactCorrupt

__all__ = ["BIG_STRING", "STORED_ARGS", "ArgsWriter", "StoredArgs", "expand_args", "load_args",
           "stored_args"]

STORED_ARGS = "application/vnd.runlog.call-args+json"
"""Media type of recorded arguments that name some of their values by hash (:func:`expand_args`)."""
BIG_STRING = 1024
"""Strings of at least this many UTF-8 bytes inside a value stored by reference are blobs of their own."""
_MARK = "runlog.stored_args"

Path = list[str | int]
NodeKey = tuple[str | None, str]
"""A chain node's identity before it is built: the previous node and the sha256 of the item's JSON."""


@dataclass(frozen=True)
class StoredArgs:
    """A call's arguments as stored: the blobs they name and the recorded arguments naming them."""

    blobs: dict[str, bytes] = field(default_factory=dict)
    """sha256 -> bytes, in the order to store them (what a blob names comes before it)."""
    recorded: bytes = b""
    """The recorded arguments (canonical JSON, media type :data:`STORED_ARGS`)."""
    nodes: dict[NodeKey, str] = field(default_factory=dict)
    """The chain nodes built here (not found in ``known``), for the next call's ``known``."""


def _lift(value: Any, blobs: dict[str, bytes], cid: Callable[[bytes], str]) -> tuple[Any, list[Path]]:
    """``value`` with each big string replaced by its sha256 (its blob added to ``blobs``), and the
    paths of the replaced strings."""
    refs: list[Path] = []

    def walk(v: Any, path: Path) -> Any:
        if isinstance(v, str):
            if len(v) * 4 < BIG_STRING or len(v.encode("utf-8")) < BIG_STRING:  # at most 4 bytes a char
                return v
            data = canonical_json(v)
            sha = cid(data)
            blobs.setdefault(sha, data)
            refs.append(path)
            return sha
        if isinstance(v, dict):
            return {k: walk(x, [*path, k]) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [walk(x, [*path, i]) for i, x in enumerate(v)]
        return v

    return walk(value, []), refs


def _blob(fields: dict[str, Any], value: Any, blobs: dict[str, bytes], cid: Callable[[bytes], str]) -> str:
    lifted, refs = _lift(value, blobs, cid)
    data = canonical_json({**fields, "value": lifted, "refs": refs})
    sha = cid(data)
    blobs.setdefault(sha, data)
    return sha


def _item_key(prev: str | None, item: Any) -> NodeKey:
    # plain json.dumps (C): the arguments already passed canonical_json's checks
    text = json.dumps(item, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return prev, sha256_hex(text.encode("utf-8"))


def stored_args(args: Mapping[str, Any], by_ref: Collection[str],
                known: Mapping[NodeKey, str] | None = None,
                content_id: Callable[[bytes], str] = sha256_hex) -> StoredArgs:
    """How a call with ``args`` is stored when the arguments named in ``by_ref`` go by reference.

    ``content_id``: the name a blob's bytes get in the store (its sha256; the envelope's where payloads
    are encrypted, :meth:`~runlog.producers.calls._artifacts.ArtifactStore.content_id`).

    ``known``: chain nodes already stored with all they name (:attr:`StoredArgs.nodes` of earlier
    calls whose blobs were stored): not built again, and not in :attr:`StoredArgs.blobs`, so a
    call costs its new items, not its whole list."""
    blobs: dict[str, bytes] = {}
    inline: dict[str, Any] = {}
    refs: dict[str, Any] = {}
    nodes: dict[NodeKey, str] = {}
    for name, value in args.items():
        if name not in by_ref:
            inline[name] = value
        elif isinstance(value, list | tuple):
            head: str | None = None
            for item in value:
                key = _item_key(head, item)
                found = None if known is None else known.get(key)
                if found is None:
                    found = nodes[key] = _blob({"prev": head}, item, blobs, content_id)
                head = found
            refs[name] = {"chain": head, "length": len(value)}
        else:
            refs[name] = {"blob": _blob({}, value, blobs, content_id)}
    recorded = canonical_json({_MARK: 1, "args": inline, "refs": refs})
    return StoredArgs(blobs, recorded, nodes)


def _put_at(root: Any, path: Path, value: Any) -> Any:
    if not path:
        return value
    node = root
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return root


def _value(blob: Mapping[str, Any], load: Callable[[str], bytes]) -> Any:
    value = blob["value"]
    for path in blob["refs"]:
        node = value
        for step in path:
            node = node[step]
        value = _put_at(value, path, json.loads(load(node)))
    return value


def expand_args(recorded: bytes | Mapping[str, Any], load: Callable[[str], bytes]) -> dict[str, Any]:
    """The full arguments of a call from its recorded arguments, reading the blobs they name with
    ``load(sha256) -> bytes``; recorded arguments that name nothing are returned as they are.

    Raises:
        ArtifactCorrupt: a chain is not as long as recorded.
    """
    data = json.loads(recorded) if isinstance(recorded, bytes | bytearray) else dict(recorded)
    if data.get(_MARK) != 1 or set(data) != {_MARK, "args", "refs"}:
        return dict(data)
    out = dict(data["args"])
    for name, ref in data["refs"].items():
        if "blob" in ref:
            out[name] = _value(json.loads(load(ref["blob"])), load)
            continue
        items: list[Any] = []
        sha = ref["chain"]
        while sha is not None:
            node = json.loads(load(sha))
            items.append(_value(node, load))
            sha = node["prev"]
        if len(items) != ref["length"]:
            raise ArtifactCorrupt(str(ref["chain"]), f"argument {name!r}: a chain of {len(items)} items, "
                                                     f"{ref['length']} recorded")
        out[name] = items[::-1]
    return out


def load_args(store: ArtifactStore, ref: ArtifactRef) -> dict[str, Any]:
    """A call's full arguments from its ``TOOL_CALLED`` ``payload_ref``, whether they were stored whole
    or by reference (:func:`expand_args`); the canonical JSON of the result hashes to the call's
    request hash.

    Raises:
        ArtifactMissing: the arguments or a blob they name are not in the store.
        ArtifactCorrupt: they are there, with other bytes.
    """
    data = store.get(ref)
    if ref.media_type != STORED_ARGS:
        loaded: dict[str, Any] = json.loads(data)
        return loaded

    def load(sha: str) -> bytes:  # the store is content-addressed: the hash names the blob
        return store.get(ArtifactRef(f"sha256:{sha}", sha, 0, JSON))

    return expand_args(data, load)


class ArgsWriter:
    """Stores a stage's call arguments, remembering the chain nodes it stored (a part of the stage
    context, :class:`runlog.producers.calls._call_steps._ContextCore`)."""

    def __init__(self, artifacts: StageArtifacts) -> None:
        self._artifacts = artifacts
        self._lock = threading.Lock()
        self._nodes: dict[NodeKey, str] = {}

    def put(self, tool: Tool, args: Mapping[str, Any], args_bytes: bytes) -> Steps[ArtifactRef]:
        """Store a call's arguments (``args_bytes``: their canonical JSON), by reference as the tool
        declares; a blob this stage already stored is not stored again."""
        if not tool.args_by_ref:
            return (yield from self._artifacts.put(args_bytes))
        with self._lock:
            known = dict(self._nodes)
        form = stored_args(args, tool.args_by_ref, known, self._artifacts.store.content_id)
        for sha, data in form.blobs.items():
            if not self._artifacts.has(sha):  # found by its hash alone (load_args): stored, never inline
                yield from self._artifacts.put(data, inline=False)
        with self._lock:  # only now: a node is known once everything it names is stored
            self._nodes.update(form.nodes)
        return (yield from self._artifacts.put(form.recorded, STORED_ARGS))
