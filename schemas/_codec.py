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

The codec is four modules: this one frames and unframes records (:class:`Codec`); the bundled
schemas and fingerprints are in :mod:`runlog.schemas._avsc`, the mapping between the Python types and
Avro dicts in :mod:`runlog.schemas._mapping`, the registry's ids and writer schemas in
:mod:`runlog.schemas._registry_framing`. Their public names stay importable from here.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import json
import struct
import threading
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

import fastavro
from fastavro.read import SchemaResolutionError

from runlog.schemas._avro_gen import Decoder, Encoder, Unsupported, compile_schema
from runlog.schemas._avro_object_reader import ObjectDecoder, compile_object_decoder
from runlog.schemas._avro_objects import ObjectEncoder, compile_object_encoder
from runlog.schemas._avsc import (
    RECORD_FILES,
    Writer,
    crc64_avro,
    load_file,
    load_past_schemas,
    load_schema,
    writer_for,
)
from runlog.schemas._mapping import KINDS
from runlog.schemas._registry_framing import RegistryFraming, SchemaRegistry
from runlog.schemas._types import Checkpoint, Effect, ResumeRequest, RunEvent, RunSubmission, StreamRecord
from runlog.schemas._versions import CURRENT_SCHEMA_VERSION, fit, pinned_files, restore
from runlog.schemas.errors import ConfigError, DecodeError
from runlog.schemas.settings import Settings, redact_urls

__all__ = [
    "SINGLE_OBJECT_MAGIC",
    "Codec",
    "SchemaRegistry",
    "SchemaSource",
    "body_of",
    "body_start",
    "crc64_avro",
    "load_past_schemas",
    "load_schema",
    "registry_codec",
]

_RECORD_FILES = RECORD_FILES
"""Record full name -> its ``.avsc`` file (:data:`runlog.schemas._avsc.RECORD_FILES`)."""
_KINDS = KINDS
"""The records by Python type (:data:`runlog.schemas._mapping.KINDS`)."""

SINGLE_OBJECT_MAGIC = b"\xc3\x01"
_SR_MAGIC = 0
DEFAULT_MAX_RECORD_BYTES = 1_000_000

T = TypeVar("T")


class SchemaSource(Protocol):
    """Where writer schemas are published and found by fingerprint (the schemas topic)."""

    def publish(self, record_name: str, fingerprint: bytes, schema: dict[str, Any]) -> None:
        ...

    def lookup(self, fingerprint: bytes) -> dict[str, Any] | None:
        ...


class Codec:
    """Encodes and decodes Runlog records; see the module docstring for the framings.

    Args:
        registry: a Schema Registry client; when given, records are written in
            its wire format and registry ids are resolved on read.
        max_record_bytes: records larger than this are refused on both sides.
        auto_register: with a registry, register a record's schema on first use;
            False: only look its id up (the schema must have been registered).
        registry_url: the registry as named in error messages, credentials masked.
        schema_version: the schema version records are written with (``RUNLOG_SCHEMA_VERSION``;
            None: the current one); records are read whatever their writer's version.
    """

    @classmethod
    def from_settings(cls, settings: Settings, *, schema_log: bool = True) -> Codec:
        """The codec every Runlog writer and reader uses.

        It writes with the schema version ``RUNLOG_SCHEMA_VERSION`` pins. With ``schema_log`` (the
        default; False for an in-memory log) it publishes each writer schema on the schemas topic
        before its first record and looks a fingerprint it does not know up there
        (:class:`runlog.schemas._schema_log.SchemaLog`; no connection until either happens).

        Without ``RUNLOG_SCHEMA_REGISTRY_URL``: a new single-object codec. With it: the
        process's codec for that registry (one per registry configuration, so ids and
        writer schemas are fetched once), which writes the registry wire format and reads
        both framings; making it the first time checks that the registry answers.

        Raises:
            RegistryUnavailable: the registry did not answer (a ``ConfigError``).
            ConfigError: registry client settings or credentials refused.
        """
        if not settings.schema_registry_url:
            codec = cls(max_record_bytes=settings.max_record_bytes, schema_version=settings.schema_version)
        else:
            codec = registry_codec(settings)
        if schema_log:
            from runlog.schemas._schema_log import SchemaLog

            codec = codec.with_schema_log(SchemaLog.of(settings))
        return codec

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
        schema_version: int | None = None,
    ) -> None:
        self._registry = None if registry is None else RegistryFraming(
            registry, auto_register=auto_register, url=registry_url)
        self._max = max_record_bytes
        self._readers: dict[str, Any] = {}
        self._schemas: dict[str, dict[str, Any]] = {}
        self._by_fp: dict[bytes, Writer] = {}
        self._own_fp: dict[str, bytes] = {}
        self._fast: dict[str, tuple[Encoder, Decoder]] = {}
        self._objects: dict[str, ObjectEncoder] = {}
        """Writers of a record's object without its Avro dict: the bundled ``RunEvent`` (the write path)."""
        self._object_readers: dict[str, ObjectDecoder] = {}
        """Readers of a record's object without its Avro dict: the bundled ``RunEvent`` written with
        its own schema (the read path; other writer schemas through fastavro and the dict)."""
        bundled = _bundled()  # compiled once per process: a codec is cheap to make
        self._schemas.update(bundled.schemas)
        self._readers.update(bundled.readers)
        self._fast.update(bundled.fast)
        self._objects.update(bundled.objects)
        self._object_readers.update(bundled.object_readers)
        self._by_fp.update(bundled.by_fp)
        self._own_fp.update(bundled.own_fp)
        self.schema_version = CURRENT_SCHEMA_VERSION if schema_version is None else schema_version
        """The schema version this codec writes."""
        self._pinned: dict[str, tuple[dict[str, Any], Writer]] = {}
        """Records written with an older schema than the current one: its document and writer."""
        for name, file in pinned_files(schema_version).items():
            doc = load_file(file)
            w = writer_for(doc)
            self._pinned[name] = (doc, w)
            self._by_fp[w.fingerprint] = w
        self._schema_log: SchemaSource | None = None
        self._published: set[str] = set()
        """Records whose writer schema this codec has published on the schema log."""
        self._resolve_lock = threading.Lock()

    def with_schema_log(self, log: SchemaSource) -> Codec:
        """This codec, publishing the writer schema of each record on ``log`` before its first
        record is encoded, and asking ``log`` for a writer schema whose fingerprint it does not know
        before a record is refused as ``unknown_schema``. Returns ``self``."""
        self._schema_log = log
        return self

    def schema(self, record_name: str) -> dict[str, Any]:
        """The current (reader and writer) schema of a record, as JSON-ready dict."""
        return copy.deepcopy(self._schemas[record_name])

    def fingerprint(self, record_name: str) -> bytes:
        """The 8-byte single-object fingerprint of this codec's schema for a record."""
        return self._own_fp[record_name]

    def writer_schema(self, record_name: str) -> tuple[dict[str, Any], bytes]:
        """The schema this codec writes a record with (the pinned version's, else the current one)
        and its fingerprint."""
        pinned = self._pinned.get(record_name)
        if pinned is not None:
            return copy.deepcopy(pinned[0]), pinned[1].fingerprint
        return copy.deepcopy(self._schemas[record_name]), self._own_fp[record_name]

    def add_writer_schema(self, schema: dict[str, Any] | str) -> bytes:
        """Teach the codec another version of a record's schema, so data written
        with it decodes. Returns its fingerprint."""
        doc = json.loads(schema) if isinstance(schema, str) else schema
        w = writer_for(doc)
        if w.record_name not in self._readers:
            raise ConfigError(f"{w.record_name!r} is not a Runlog record")
        self._by_fp[w.fingerprint] = w
        return w.fingerprint

    # -- encoding --------------------------------------------------------------------------

    def encode(self, value: RunEvent | Checkpoint | Effect | ResumeRequest | StreamRecord | RunSubmission
               ) -> bytes:
        """Encode a record in the configured framing."""
        kind = self._writer_kind(type(value))
        name = kind.record_name
        pinned = self._pinned.get(name)
        if pinned is not None:
            return self._encode_pinned(kind, name, pinned, value)
        if self._registry is None:
            header = SINGLE_OBJECT_MAGIC + self._own_fp[name]
        else:
            header = struct.pack(">bI", _SR_MAGIC, self._registry.schema_id(name, self._schemas[name]))
        direct = self._objects.get(name)
        if direct is None:
            data = self._encode_dict(kind, name, header, value)
        else:
            try:
                data = header + direct(value)  # the attributes written directly (_avro_objects)
            except (TypeError, AttributeError, KeyError, OverflowError, struct.error):
                # a value the direct writer does not take: through its Avro dict, as before
                data = self._encode_dict(kind, name, header, value)
        if len(data) > self._max:
            raise DecodeError("oversized", f"{name} of {len(data)} bytes exceeds {self._max}")
        return data

    def publish_writer_schemas(self, *types: type) -> None:
        """Put the writer schemas of the record ``types`` on the schema log now (what the first
        :meth:`encode` of each would do), so that first encode does not wait for the broker: a
        writer on an event loop calls this on a thread before its first records. Without a schema
        log, nothing.

        Raises:
            ConfigError: a type that is not a Runlog record.
            LogUnavailable: the broker did not acknowledge them.
        """
        for t in types:
            self._writer_kind(t)

    def _writer_kind(self, t: type) -> Any:
        """The record kind of type ``t``, its writer schema on the schema log (published the first
        time, once per codec).

        Raises:
            ConfigError: ``t`` is not a Runlog record.
            LogUnavailable: the broker did not acknowledge the schema.
        """
        kind = KINDS.get(t)
        if kind is None:
            raise ConfigError(f"cannot encode {t.__name__}: not a Runlog record")
        if self._schema_log is not None and kind.record_name not in self._published:
            self._publish(kind.record_name)
        return kind

    def _publish(self, name: str) -> None:
        """Put the writer schema of ``name`` on the schema log (once per codec; the log itself
        publishes a fingerprint once per process)."""
        assert self._schema_log is not None
        doc, fp = self.writer_schema(name)
        self._schema_log.publish(name, fp, doc)
        self._published.add(name)

    def _encode_pinned(self, kind: Any, name: str, pinned: tuple[dict[str, Any], Writer],
                       value: Any) -> bytes:
        """``value`` written with the pinned version's schema: fitted to it first (a newer field at
        its default left out, ``usage`` carried in ``attributes``, anything else refused)."""
        doc, w = pinned
        if self._registry is None:
            header = SINGLE_OBJECT_MAGIC + w.fingerprint
        else:
            header = struct.pack(">bI", _SR_MAGIC, self._registry.schema_id(name, doc))
        record = fit(kind.to_dict(value), doc, self._schemas[name], self.schema_version, name)
        buf = io.BytesIO()
        buf.write(header)
        fastavro.schemaless_writer(buf, w.parsed, record)
        data = buf.getvalue()
        if len(data) > self._max:
            raise DecodeError("oversized", f"{name} of {len(data)} bytes exceeds {self._max}")
        return data

    def _encode_dict(self, kind: Any, name: str, header: bytes, value: Any) -> bytes:
        """``header`` + the body of ``value`` written from its Avro dict (:mod:`runlog.schemas._mapping`)."""
        record = kind.to_dict(value)
        fast = self._fast.get(name)
        try:
            if fast is None:
                raise TypeError(name)
            return header + fast[0](record)
        except (TypeError, AttributeError, KeyError, OverflowError, struct.error):
            # not what the generated writer takes: fastavro writes it, or names what is wrong
            buf = io.BytesIO()
            buf.write(header)
            fastavro.schemaless_writer(buf, self._readers[name], record)
            return buf.getvalue()

    # -- decoding --------------------------------------------------------------------------

    def decode(self, data: bytes, kind: type[T]) -> T:
        """Decode bytes of either framing into ``kind``, resolving schema versions.

        Raises:
            DecodeError: with ``reason`` naming what is wrong with the bytes.
        """
        return self._decode(data, kind)[0]

    def decode_with_body(self, data: bytes, kind: type[T]) -> tuple[T, bytes]:
        """:meth:`decode`, and the record's Avro body as received (``data`` after its framing):
        what a version-2 event hash is computed over (``runlog.schemas.event_hash(event, body)``), taken
        from the bytes read, never re-encoded, so a record written with another version of the
        schema hashes as its writer hashed it.

        Raises:
            DecodeError: as :meth:`decode`.
        """
        record, start = self._decode(data, kind)
        return record, data[start:]

    def _decode(self, data: bytes, kind: type[T]) -> tuple[T, int]:
        k = KINDS.get(kind)
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
        if writer.parsed is reader:
            direct = self._object_readers.get(k.record_name)
            if direct is not None:  # the object read from the bytes (runlog.schemas._avro_object_reader)
                obj, end = self._read_fast(direct, data, start)
                if end != len(data):
                    raise DecodeError("invalid_body", f"{len(data) - end} trailing bytes after the record")
                return cast(T, obj), start
        fast = self._fast.get(k.record_name) if writer.parsed is reader else None
        if fast is not None:
            record, end = self._read_fast(fast[1], data, start)
        else:
            record, end = self._read_fastavro(data, start, writer.parsed, reader)
        if end != len(data):
            raise DecodeError("invalid_body", f"{len(data) - end} trailing bytes after the record")
        if not isinstance(record, dict):
            raise DecodeError("invalid_body", "body is not a record")
        if k.record_name == "runlog.RunEvent" and writer.parsed is not reader:
            record = restore(record)  # usage a writer pinned below version 5 carried in attributes
        try:
            return cast(T, k.from_dict(record)), start
        except (ValueError, KeyError, TypeError) as err:
            raise DecodeError("invalid_body", f"{type(err).__name__}: {err}") from err

    @staticmethod
    def _read_fast(decode: Decoder, data: bytes, start: int) -> tuple[Any, int]:
        try:
            return decode(data, start)
        except IndexError as err:
            raise DecodeError("truncated", f"body ends early ({len(data)} bytes)") from err
        except (ValueError, UnicodeDecodeError) as err:
            raise DecodeError("invalid_body", f"{type(err).__name__}: {err}") from err

    @staticmethod
    def _read_fastavro(data: bytes, start: int, writer: Any, reader: Any) -> tuple[Any, int]:
        bio = io.BytesIO(data)
        bio.seek(start)
        try:
            record = fastavro.schemaless_reader(bio, writer, None if writer is reader else reader)
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
        return record, bio.tell()

    def _writer_of(self, data: bytes) -> tuple[Writer, int]:
        start = body_start(data)
        if start == 10:
            w = self._by_fp.get(data[2:10])
            if w is None:
                w = self._resolve(data[2:10])
            return w, 10
        return self._sr_writer(struct.unpack(">I", data[1:5])[0]), 5

    def _resolve(self, fp: bytes) -> Writer:
        """The writer schema of an unknown fingerprint, asked of the registry (when this codec has
        one), then of the schema log (when it has one), and kept.

        Raises:
            DecodeError: ``unknown_schema``: neither has it (or what they hold is not a Runlog record
                schema with that fingerprint).
        """
        with self._resolve_lock:
            w = self._by_fp.get(fp)
            if w is not None:
                return w
            asked = []
            doc = None
            if self._registry is not None:
                asked.append("the registry")
                doc = self._registry.schema_by_fingerprint(fp, self._readers)
            if doc is None and self._schema_log is not None:
                asked.append("the schema log")
                doc = self._schema_log.lookup(fp)
            if doc is None:
                where = f" (asked {' and '.join(asked)})" if asked else ""
                raise DecodeError("unknown_schema", f"no known schema has fingerprint {fp.hex()}{where}")
            try:
                w = writer_for(doc)
            except Exception as err:  # whatever a bad document raises, it is no schema
                raise DecodeError("unknown_schema", f"the schema published for fingerprint {fp.hex()} "
                                  f"does not parse: {type(err).__name__}: {err}") from err
            if w.fingerprint != fp:
                raise DecodeError("unknown_schema", f"the schema published for fingerprint {fp.hex()} has "
                                  f"fingerprint {w.fingerprint.hex()}")
            if w.record_name not in self._readers:
                raise DecodeError("wrong_type",
                                  f"fingerprint {fp.hex()} is {w.record_name}, not a Runlog record")
            self._by_fp[fp] = w
            return w

    def _sr_writer(self, sid: int) -> Writer:
        if self._registry is None:
            raise DecodeError("unknown_schema", f"registry schema id {sid} but no registry configured")
        return self._registry.writer(sid, self._by_fp, self._readers)


def body_start(data: bytes) -> int:
    """Where a framed record's Avro body starts: 10 after ``C3 01`` + 8-byte fingerprint, 5 after
    ``00`` + 4-byte schema id.

    Raises:
        DecodeError: ``unknown_framing`` or ``truncated`` (a header shorter than its framing's).
    """
    if data[:2] == SINGLE_OBJECT_MAGIC:
        if len(data) < 10:
            raise DecodeError("truncated", f"single-object header needs 10 bytes, got {len(data)}")
        return 10
    if data[:1] == b"\x00":
        if len(data) < 5:
            raise DecodeError("truncated", f"registry header needs 5 bytes, got {len(data)}")
        return 5
    head = data[:2].hex() or "empty"
    raise DecodeError("unknown_framing", f"first bytes {head} are neither C301 nor 00")


def body_of(data: bytes) -> bytes:
    """A framed record's Avro body (the bytes after its framing, :func:`body_start`): what a writer
    hashes for a version-2 event hash (``runlog.schemas.event_hash(event, body_of(data))``)."""
    return data[body_start(data):]


_REGISTRY_LOCK = threading.Lock()
_REGISTRY_CODECS: dict[tuple[Any, ...], Codec] = {}


def registry_codec(settings: Settings) -> Codec:
    """The process's codec for the registry of ``settings`` (writes its wire format, reads both
    framings), made once per registry configuration, ``RUNLOG_SCHEMA_REGISTRY_AUTO_REGISTER``,
    ``RUNLOG_MAX_RECORD_BYTES`` and ``RUNLOG_SCHEMA_VERSION`` (a pinned writer registers and writes
    that version's schemas, as without a registry); the first call checks that the registry answers.

    Raises:
        RegistryUnavailable: the registry did not answer.
        ConfigError: no URL, client settings refused, or credentials refused.
    """
    from runlog.schemas._registry_client import check_registry, client_key, registry_client

    key = (*client_key(settings), settings.schema_registry_auto_register, settings.max_record_bytes,
           settings.schema_version)
    with _REGISTRY_LOCK:
        codec = _REGISTRY_CODECS.get(key)
    if codec is not None:
        return codec
    client = registry_client(settings)
    url = redact_urls(settings.schema_registry_url or "")
    check_registry(client, url)
    codec = Codec(client, max_record_bytes=settings.max_record_bytes,
                  auto_register=settings.schema_registry_auto_register, registry_url=url,
                  schema_version=settings.schema_version)
    with _REGISTRY_LOCK:
        return _REGISTRY_CODECS.setdefault(key, codec)


@dataclass(frozen=True)
class _Bundled:
    """The bundled schemas of every record, parsed and compiled (what every codec starts from)."""

    schemas: dict[str, dict[str, Any]]
    readers: dict[str, Any]
    fast: dict[str, tuple[Encoder, Decoder]]
    objects: dict[str, ObjectEncoder]
    object_readers: dict[str, ObjectDecoder]
    by_fp: dict[bytes, Writer]
    own_fp: dict[str, bytes]


@functools.lru_cache(maxsize=1)
def _bundled() -> _Bundled:
    """Parse and compile the bundled schemas once per process (the generated readers and writers are
    pure functions of their schema; compiling them took about a third of a second, which every
    short-lived codec, such as one reading a run's events back, paid)."""
    b = _Bundled({}, {}, {}, {}, {}, {}, {})
    for name in RECORD_FILES:
        schema = load_schema(name)
        b.schemas[name] = schema
        w = writer_for(schema)
        b.readers[name] = w.parsed
        with contextlib.suppress(Unsupported):  # the generated writer and reader (_avro_gen)
            b.fast[name] = compile_schema(w.parsed)
        if name == "runlog.RunEvent":
            with contextlib.suppress(Unsupported):
                b.objects[name] = compile_object_encoder(w.parsed, RunEvent)
            with contextlib.suppress(Unsupported):
                b.object_readers[name] = compile_object_decoder(w.parsed, RunEvent)
        b.by_fp[w.fingerprint] = w
        b.own_fp[name] = w.fingerprint
        for past in load_past_schemas(name):
            pw = writer_for(past)
            b.by_fp[pw.fingerprint] = pw
    return b
