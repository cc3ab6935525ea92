"""The codec: Runlog records to bytes and back, the only place that sees Avro.

Two framings are written, and both are read:

* Avro single-object encoding (``C3 01`` + 8-byte little-endian CRC-64-AVRO
  fingerprint of the writer schema's parsing canonical form + body). The default;
  needs no registry. Writer schemas are looked up by fingerprint among the
  schemas this codec knows (the bundled ones plus any added with
  :meth:`Codec.add_writer_schema`).
* The Confluent Schema Registry wire format (``00`` + 4-byte big-endian schema id
  + body), used for writing when a registry client is given. A record's schema id
  is registered (or only looked up, ``auto_register=False``) once and cached;
  writer schemas are fetched from the registry by id once and cached, then
  resolved against the reader schema. Subjects follow the record name strategy
  (``runlog.RunEvent``).

Every writer and reader builds its codec with :meth:`Codec.from_settings`: with
``RUNLOG_SCHEMA_REGISTRY_URL`` set, the process's registry codec
(:func:`registry_codec`); without it, a single-object codec.

Every way a byte string can fail to be a record raises :class:`DecodeError`
with a ``reason``: ``unknown_framing``, ``unknown_schema``, ``truncated``,
``invalid_body``, ``wrong_type`` or ``oversized``.
"""

from __future__ import annotations

import copy
import io
import json
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any, Generic, Protocol, TypeVar, cast

import fastavro
from fastavro.read import SchemaResolutionError
from fastavro.schema import SchemaParseException, UnknownType, to_parsing_canonical_form

from schemas._types import (
    ArtifactRef,
    Checkpoint,
    Effect,
    EffectStatus,
    ErrorInfo,
    EventType,
    ReplayPolicy,
    ResumeRequest,
    RuleResult,
    RunEvent,
    StageSpec,
    WorkflowSpec,
)
from schemas.errors import ConfigError, DecodeError, RunlogError
from schemas.settings import Settings, redact_urls

__all__ = [
    "SINGLE_OBJECT_MAGIC",
    "Codec",
    "SchemaRegistry",
    "crc64_avro",
    "load_past_schemas",
    "load_schema",
    "registry_codec",
]

SINGLE_OBJECT_MAGIC = b"\xc3\x01"
_SR_MAGIC = 0
DEFAULT_MAX_RECORD_BYTES = 1_000_000

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
_RECORD_FILES = {
    "runlog.RunEvent": "run_event.avsc",
    "runlog.Checkpoint": "checkpoint.avsc",
    "runlog.Effect": "effect.avsc",
    "runlog.ResumeRequest": "resume_request.avsc",
}
# Earlier versions of a record's schema, still read (their data is on topics with unlimited retention).
_PAST_FILES: dict[str, tuple[str, ...]] = {
    "runlog.RunEvent": ("run_event.v1.avsc",),
}


def _read_avsc(name: str) -> dict[str, Any]:
    text = resources.files("schemas").joinpath("avro", name).read_text(encoding="utf-8")
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
        top = _read_avsc(_RECORD_FILES[record_name])
    except KeyError:
        raise ConfigError(f"no bundled schema named {record_name!r}") from None
    return cast(dict[str, Any], _inline(top, _shared_defs(), set()))


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


# -- mapping between Python types and Avro dicts ---------------------------------------------


def _artifact_to(a: ArtifactRef) -> dict[str, Any]:
    return {"uri": a.uri, "sha256": a.sha256, "size": a.size, "media_type": a.media_type}


def _artifact_from(d: dict[str, Any]) -> ArtifactRef:
    return ArtifactRef(d["uri"], d["sha256"], d["size"], d["media_type"])


def _rule_to(r: RuleResult) -> dict[str, Any]:
    return {"rule": r.rule, "passed": r.passed, "detail": r.detail}


def _rule_from(d: dict[str, Any]) -> RuleResult:
    return RuleResult(d["rule"], d["passed"], d["detail"])


def _workflow_to(w: WorkflowSpec) -> dict[str, Any]:
    return {
        "name": w.name,
        "version": w.version,
        "stages": [
            {"name": s.name, "inputs": list(s.inputs), "rules": list(s.rules),
             "checkpoint": s.checkpoint}
            for s in w.stages
        ],
    }


def _workflow_from(d: dict[str, Any]) -> WorkflowSpec:
    return WorkflowSpec(
        d["name"],
        d["version"],
        tuple(
            StageSpec(s["name"], tuple(s["inputs"]), tuple(s["rules"]), s["checkpoint"])
            for s in d["stages"]
        ),
    )


def _event_to(e: RunEvent) -> dict[str, Any]:
    return {
        "run_id": e.run_id,
        "seq": e.seq,
        "epoch": e.epoch,
        "type": e.type.value,
        "occurred_at": e.occurred_at,
        "stage": e.stage,
        "workflow": None if e.workflow is None else _workflow_to(e.workflow),
        "input_versions": dict(e.input_versions),
        "payload_ref": None if e.payload_ref is None else _artifact_to(e.payload_ref),
        "artifact_refs": [_artifact_to(a) for a in e.artifact_refs],
        "tool": e.tool,
        "call_id": e.call_id,
        "replay_policy": None if e.replay_policy is None else e.replay_policy.value,
        "idempotency_key": e.idempotency_key,
        "delivery_key": e.delivery_key,
        "target": e.target,
        "request_hash": e.request_hash,
        "external_id": e.external_id,
        "verification": [_rule_to(r) for r in e.verification],
        "error": None
        if e.error is None
        else {"kind": e.error.kind, "message": e.error.message, "retryable": e.error.retryable},
        "parent_run_id": e.parent_run_id,
        "forked_from_seq": e.forked_from_seq,
        "attributes": dict(e.attributes),
        "prev_hash": e.prev_hash,
    }


def _event_from(d: dict[str, Any]) -> RunEvent:
    err = d["error"]
    pol = d["replay_policy"]
    return RunEvent(
        run_id=d["run_id"],
        seq=d["seq"],
        epoch=d["epoch"],
        type=EventType(d["type"]),
        occurred_at=d["occurred_at"],
        stage=d["stage"],
        workflow=None if d["workflow"] is None else _workflow_from(d["workflow"]),
        input_versions=d["input_versions"],
        payload_ref=None if d["payload_ref"] is None else _artifact_from(d["payload_ref"]),
        artifact_refs=tuple(_artifact_from(a) for a in d["artifact_refs"]),
        tool=d["tool"],
        call_id=d["call_id"],
        replay_policy=None if pol is None else ReplayPolicy(pol),
        idempotency_key=d["idempotency_key"],
        delivery_key=d["delivery_key"],
        target=d["target"],
        request_hash=d["request_hash"],
        external_id=d["external_id"],
        verification=tuple(_rule_from(r) for r in d["verification"]),
        error=None if err is None else ErrorInfo(err["kind"], err["message"], err["retryable"]),
        parent_run_id=d["parent_run_id"],
        forked_from_seq=d["forked_from_seq"],
        attributes=d["attributes"],
        prev_hash=d.get("prev_hash"),
    )


def _checkpoint_to(c: Checkpoint) -> dict[str, Any]:
    return {
        "checkpoint_id": c.checkpoint_id,
        "run_id": c.run_id,
        "last_seq": c.last_seq,
        "partition": c.partition,
        "offset": c.offset,
        "stage": c.stage,
        "inputs": dict(c.inputs),
        "artifacts": [_artifact_to(a) for a in c.artifacts],
        "verified_by": [_rule_to(r) for r in c.verified_by],
        "next_stage": c.next_stage,
        "workflow_version": c.workflow_version,
        "created_at": c.created_at,
    }


def _checkpoint_from(d: dict[str, Any]) -> Checkpoint:
    return Checkpoint(
        checkpoint_id=d["checkpoint_id"],
        run_id=d["run_id"],
        last_seq=d["last_seq"],
        partition=d["partition"],
        offset=d["offset"],
        stage=d["stage"],
        created_at=d["created_at"],
        inputs=d["inputs"],
        artifacts=tuple(_artifact_from(a) for a in d["artifacts"]),
        verified_by=tuple(_rule_from(r) for r in d["verified_by"]),
        next_stage=d["next_stage"],
        workflow_version=d["workflow_version"],
    )


def _effect_to(e: Effect) -> dict[str, Any]:
    return {
        "delivery_key": e.delivery_key,
        "run_id": e.run_id,
        "target": e.target,
        "status": e.status.value,
        "external_id": e.external_id,
        "tool": e.tool,
        "stage": e.stage,
        "seq": e.seq,
        "updated_at": e.updated_at,
    }


def _effect_from(d: dict[str, Any]) -> Effect:
    return Effect(
        delivery_key=d["delivery_key"],
        run_id=d["run_id"],
        target=d["target"],
        status=EffectStatus(d["status"]),
        seq=d["seq"],
        updated_at=d["updated_at"],
        external_id=d["external_id"],
        tool=d["tool"],
        stage=d["stage"],
    )


def _resume_to(r: ResumeRequest) -> dict[str, Any]:
    return {
        "run_id": r.run_id,
        "reason": r.reason,
        "requested_by": r.requested_by,
        "requested_at": r.requested_at,
    }


def _resume_from(d: dict[str, Any]) -> ResumeRequest:
    return ResumeRequest(d["run_id"], d["requested_at"], d["reason"], d["requested_by"])


T = TypeVar("T")


@dataclass(frozen=True)
class _Kind(Generic[T]):
    record_name: str
    py_type: type[T]
    to_dict: Callable[[T], dict[str, Any]]
    from_dict: Callable[[dict[str, Any]], T]


_KINDS: dict[type[Any], _Kind[Any]] = {
    RunEvent: _Kind("runlog.RunEvent", RunEvent, _event_to, _event_from),
    Checkpoint: _Kind("runlog.Checkpoint", Checkpoint, _checkpoint_to, _checkpoint_from),
    Effect: _Kind("runlog.Effect", Effect, _effect_to, _effect_from),
    ResumeRequest: _Kind("runlog.ResumeRequest", ResumeRequest, _resume_to, _resume_from),
}


class SchemaRegistry(Protocol):
    """The part of confluent-kafka's ``SchemaRegistryClient`` the codec uses."""

    def register_schema(self, subject_name: str, schema: Any, normalize_schemas: bool = ...) -> int:
        ...

    def get_schema(self, schema_id: int, *args: Any, **kwargs: Any) -> Any:
        ...

    def lookup_schema(self, subject_name: str, schema: Any, *args: Any, **kwargs: Any) -> Any:
        ...


@dataclass(frozen=True)
class _Writer:
    record_name: str
    parsed: Any
    fingerprint: bytes


class Codec:
    """Encodes and decodes Runlog records; see the module docstring for the framings.

    Args:
        registry: a Schema Registry client; when given, records are written in
            its wire format and registry ids are resolved on read.
        max_record_bytes: records larger than this are refused on both sides.
        auto_register: with a registry, register a record's schema on first use;
            False: only look its id up (the schema must have been registered).
        registry_url: the registry as named in error messages, credentials masked.
    """

    @classmethod
    def from_settings(cls, settings: Settings) -> Codec:
        """The codec every Runlog writer and reader uses.

        Without ``RUNLOG_SCHEMA_REGISTRY_URL``: a new single-object codec. With it: the
        process's codec for that registry (one per registry configuration, so ids and
        writer schemas are fetched once), which writes the registry wire format and reads
        both framings; making it the first time checks that the registry answers.

        Raises:
            RegistryUnavailable: the registry did not answer (a ``ConfigError``).
            ConfigError: registry client settings or credentials refused.
        """
        if not settings.schema_registry_url:
            return cls(max_record_bytes=settings.max_record_bytes)
        return registry_codec(settings)

    @property
    def uses_registry(self) -> bool:
        """True when records are written in the Schema Registry wire format."""
        return self._registry is not None

    def __init__(
        self,
        registry: SchemaRegistry | None = None,
        *,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        auto_register: bool = True,
        registry_url: str = "(schema registry)",
    ) -> None:
        self._registry = registry
        self._auto_register = auto_register
        self._registry_url = registry_url
        self._max = max_record_bytes
        self._readers: dict[str, Any] = {}
        self._schemas: dict[str, dict[str, Any]] = {}
        self._by_fp: dict[bytes, _Writer] = {}
        self._own_fp: dict[str, bytes] = {}
        self._sr_ids: dict[str, int] = {}
        self._sr_writers: dict[int, _Writer] = {}
        for name in _RECORD_FILES:
            schema = load_schema(name)
            self._schemas[name] = schema
            w = self._writer_for(schema)
            self._readers[name] = w.parsed
            self._by_fp[w.fingerprint] = w
            self._own_fp[name] = w.fingerprint
            for past in load_past_schemas(name):
                pw = self._writer_for(past)
                self._by_fp[pw.fingerprint] = pw

    @staticmethod
    def _writer_for(schema: dict[str, Any]) -> _Writer:
        canonical = to_parsing_canonical_form(schema)
        fp = struct.pack("<Q", crc64_avro(canonical.encode("utf-8")))
        parsed = fastavro.parse_schema(_strip_logical(schema), named_schemas={})
        return _Writer(_fullname(schema), parsed, fp)

    def schema(self, record_name: str) -> dict[str, Any]:
        """The current (reader and writer) schema of a record, as JSON-ready dict."""
        return copy.deepcopy(self._schemas[record_name])

    def fingerprint(self, record_name: str) -> bytes:
        """The 8-byte single-object fingerprint of this codec's schema for a record."""
        return self._own_fp[record_name]

    def add_writer_schema(self, schema: dict[str, Any] | str) -> bytes:
        """Teach the codec another version of a record's schema, so data written
        with it decodes. Returns its fingerprint."""
        doc = json.loads(schema) if isinstance(schema, str) else schema
        w = self._writer_for(doc)
        if w.record_name not in self._readers:
            raise ConfigError(f"{w.record_name!r} is not a Runlog record")
        self._by_fp[w.fingerprint] = w
        return w.fingerprint

    # -- encoding --------------------------------------------------------------------------

    def encode(self, value: RunEvent | Checkpoint | Effect | ResumeRequest) -> bytes:
        """Encode a record in the configured framing."""
        kind = _KINDS.get(type(value))
        if kind is None:
            raise ConfigError(f"cannot encode {type(value).__name__}: not a Runlog record")
        buf = io.BytesIO()
        if self._registry is None:
            buf.write(SINGLE_OBJECT_MAGIC)
            buf.write(self._own_fp[kind.record_name])
        else:
            buf.write(struct.pack(">bI", _SR_MAGIC, self._registry_id(kind.record_name)))
        fastavro.schemaless_writer(buf, self._readers[kind.record_name], kind.to_dict(value))
        data = buf.getvalue()
        if len(data) > self._max:
            raise DecodeError(
                "oversized", f"{kind.record_name} of {len(data)} bytes exceeds {self._max}"
            )
        return data

    def _registry_id(self, record_name: str) -> int:
        sid = self._sr_ids.get(record_name)
        if sid is None:
            from confluent_kafka.schema_registry import Schema

            assert self._registry is not None
            schema = Schema(json.dumps(self._schemas[record_name]), "AVRO")
            try:
                if self._auto_register:
                    sid = int(self._registry.register_schema(record_name, schema))
                else:
                    sid = int(self._registry.lookup_schema(record_name, schema).schema_id)
            except Exception as err:
                raise self._registry_failure(err, record_name) from err
            self._sr_ids[record_name] = sid
        return sid

    def _registry_failure(self, err: Exception, record_name: str) -> RunlogError:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        from schemas._registry_client import registry_error

        verb = "registering" if self._auto_register else "looking up"
        mapped = registry_error(err, self._registry_url, f"{verb} {record_name}")
        if mapped is not None:
            return mapped
        if not isinstance(err, SchemaRegistryError):
            return RunlogError(f"schema registry {self._registry_url}: {verb} {record_name}: "
                               f"{type(err).__name__}: {err}")
        if not self._auto_register and err.http_status_code == 404:
            return ConfigError(
                f"{record_name}'s schema is not registered at {self._registry_url} and "
                "RUNLOG_SCHEMA_REGISTRY_AUTO_REGISTER is false: run `runlog schemas register`")
        return ConfigError(f"schema registry {self._registry_url} refused {record_name}'s schema: "
                           f"{err.error_message} (HTTP {err.http_status_code})")

    # -- decoding --------------------------------------------------------------------------

    def decode(self, data: bytes, kind: type[T]) -> T:
        """Decode bytes of either framing into ``kind``, resolving schema versions.

        Raises:
            DecodeError: with ``reason`` naming what is wrong with the bytes.
        """
        k = _KINDS.get(kind)
        if k is None:
            raise ConfigError(f"{kind!r} is not a Runlog record type")
        if len(data) > self._max:
            raise DecodeError("oversized", f"{len(data)} bytes exceeds {self._max}")
        writer, start = self._writer_of(data)
        if writer.record_name != k.record_name:
            raise DecodeError(
                "wrong_type", f"bytes hold a {writer.record_name}, expected {k.record_name}"
            )
        reader = self._readers[k.record_name]
        bio = io.BytesIO(data)
        bio.seek(start)
        try:
            if writer.parsed is reader:
                record = fastavro.schemaless_reader(bio, reader, None)
            else:
                record = fastavro.schemaless_reader(bio, writer.parsed, reader)
        except (EOFError, StopIteration, struct.error) as err:
            raise DecodeError("truncated", f"body ends early ({len(data)} bytes)") from err
        except (
            SchemaResolutionError,
            ValueError,
            TypeError,
            IndexError,
            KeyError,
            OverflowError,
            MemoryError,
            UnicodeDecodeError,
        ) as err:
            raise DecodeError("invalid_body", f"{type(err).__name__}: {err}") from err
        if bio.tell() != len(data):
            raise DecodeError(
                "invalid_body", f"{len(data) - bio.tell()} trailing bytes after the record"
            )
        if not isinstance(record, dict):
            raise DecodeError("invalid_body", "body is not a record")
        try:
            return cast(T, k.from_dict(record))
        except (ValueError, KeyError, TypeError) as err:
            raise DecodeError("invalid_body", f"{type(err).__name__}: {err}") from err

    def _writer_of(self, data: bytes) -> tuple[_Writer, int]:
        if data[:2] == SINGLE_OBJECT_MAGIC:
            if len(data) < 10:
                raise DecodeError("truncated", f"single-object header needs 10 bytes, got {len(data)}")
            fp = data[2:10]
            w = self._by_fp.get(fp)
            if w is None:
                raise DecodeError("unknown_schema", f"no known schema has fingerprint {fp.hex()}")
            return w, 10
        if data[:1] == b"\x00":
            if len(data) < 5:
                raise DecodeError("truncated", f"registry header needs 5 bytes, got {len(data)}")
            sid = struct.unpack(">I", data[1:5])[0]
            return self._sr_writer(sid), 5
        head = data[:2].hex() or "empty"
        raise DecodeError("unknown_framing", f"first bytes {head} are neither C301 nor 00")

    def _sr_writer(self, sid: int) -> _Writer:
        w = self._sr_writers.get(sid)
        if w is not None:
            return w
        if self._registry is None:
            raise DecodeError("unknown_schema", f"registry schema id {sid} but no registry configured")
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        from schemas._registry_client import registry_error

        try:
            registered = self._registry.get_schema(sid)
        except Exception as err:
            # Only the registry's own "no such id" makes the record undecodable (a dead letter);
            # an unreachable registry is raised as such, so no good record is dead-lettered for it.
            mapped = registry_error(err, self._registry_url, f"fetching schema id {sid}")
            if mapped is not None:
                raise mapped from err
            if isinstance(err, SchemaRegistryError):
                raise DecodeError("unknown_schema", f"registry has no schema id {sid}: {err}") from err
            raise
        try:
            doc = json.loads(registered.schema_str)
            w = self._writer_for(doc)
        except (ValueError, TypeError, KeyError, SchemaParseException, UnknownType) as err:
            raise DecodeError("unknown_schema", f"registry schema id {sid} is not an Avro record schema: "
                              f"{type(err).__name__}: {err}") from err
        if w.record_name not in self._readers:
            raise DecodeError("wrong_type", f"registry id {sid} is {w.record_name}, not a Runlog record")
        # A schema this codec knows (its own, a past one): reuse it, so the current one decodes
        # without schema resolution.
        w = self._by_fp.get(w.fingerprint, w)
        self._sr_writers[sid] = w
        return w


_REGISTRY_LOCK = threading.Lock()
_REGISTRY_CODECS: dict[tuple[Any, ...], Codec] = {}


def registry_codec(settings: Settings) -> Codec:
    """The process's codec for the registry of ``settings`` (writes its wire format, reads both
    framings), made once per registry configuration, ``RUNLOG_SCHEMA_REGISTRY_AUTO_REGISTER`` and
    ``RUNLOG_MAX_RECORD_BYTES``; the first call checks that the registry answers.

    Raises:
        RegistryUnavailable: the registry did not answer.
        ConfigError: no URL, client settings refused, or credentials refused.
    """
    from schemas._registry_client import check_registry, client_key, registry_client

    key = (*client_key(settings), settings.schema_registry_auto_register, settings.max_record_bytes)
    with _REGISTRY_LOCK:
        codec = _REGISTRY_CODECS.get(key)
    if codec is not None:
        return codec
    client = registry_client(settings)
    url = redact_urls(settings.schema_registry_url or "")
    check_registry(client, url)
    codec = Codec(client, max_record_bytes=settings.max_record_bytes,
                  auto_register=settings.schema_registry_auto_register, registry_url=url)
    with _REGISTRY_LOCK:
        return _REGISTRY_CODECS.setdefault(key, codec)
