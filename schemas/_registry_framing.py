"""The codec's Schema Registry side: the part of a registry client it uses
(:class:`SchemaRegistry`), and :class:`RegistryFraming`, which asks the registry for the id of each
record's schema (registering it, or only looking it up) and for the writer schema behind an id read
from a record, each once, and turns the registry's failures into Runlog's errors. An unreachable
registry is raised as such (never as an undecodable record); only the registry's own "no such id"
makes a record undecodable (``unknown_schema``).

confluent-kafka's registry modules are imported on first use, so a codec without a registry never
loads them."""

from __future__ import annotations

import json
from collections.abc import Container, Iterable, Mapping
from typing import Any, Protocol

from fastavro.schema import SchemaParseException, UnknownType

from runlog.schemas._avsc import Writer, writer_for
from runlog.schemas.errors import ConfigError, DecodeError, RunlogError

__all__ = ["RegistryFraming", "SchemaRegistry"]


class SchemaRegistry(Protocol):
    """The part of confluent-kafka's ``SchemaRegistryClient`` the codec uses."""

    def register_schema(self, subject_name: str, schema: Any, normalize_schemas: bool = ...) -> int:
        ...

    def get_schema(self, schema_id: int, *args: Any, **kwargs: Any) -> Any:
        ...

    def lookup_schema(self, subject_name: str, schema: Any, *args: Any, **kwargs: Any) -> Any:
        ...

    def get_versions(self, subject_name: str, *args: Any, **kwargs: Any) -> Any:
        ...

    def get_version(self, subject_name: str, version: Any, *args: Any, **kwargs: Any) -> Any:
        ...



class RegistryFraming:
    """A registry's ids of a codec's records and its writer schemas by id, each fetched once.

    Args:
        registry: the registry client.
        auto_register: register a record's schema on first use; False: only look its id up.
        url: the registry as named in error messages, credentials masked.
    """

    def __init__(self, registry: SchemaRegistry, *, auto_register: bool, url: str) -> None:
        self.registry = registry
        self.auto_register = auto_register
        self.url = url
        self._ids: dict[str, int] = {}
        self._writers: dict[int, Writer] = {}
        self._docs_by_fp: dict[bytes, dict[str, Any]] = {}
        """Every schema of the registry's Runlog subjects seen so far, by fingerprint."""

    def schema_id(self, record_name: str, schema: dict[str, Any]) -> int:
        """The registry's id of ``schema``, the current schema of ``record_name`` (its subject).

        Raises:
            RegistryUnavailable: the registry did not answer (a ``ConfigError``).
            ConfigError: the schema was refused, or is not registered and may not be.
        """
        sid = self._ids.get(record_name)
        if sid is None:
            from confluent_kafka.schema_registry import Schema

            doc = Schema(json.dumps(schema), "AVRO")
            try:
                if self.auto_register:
                    sid = int(self.registry.register_schema(record_name, doc))
                else:
                    sid = int(self.registry.lookup_schema(record_name, doc).schema_id)
            except Exception as err:
                raise self._failure(err, record_name) from err
            self._ids[record_name] = sid
        return sid

    def _failure(self, err: Exception, record_name: str) -> RunlogError:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        from runlog.schemas._registry_client import registry_error

        verb = "registering" if self.auto_register else "looking up"
        mapped = registry_error(err, self.url, f"{verb} {record_name}")
        if mapped is not None:
            return mapped
        if not isinstance(err, SchemaRegistryError):
            return RunlogError(f"schema registry {self.url}: {verb} {record_name}: "
                               f"{type(err).__name__}: {err}")
        if not self.auto_register and err.http_status_code == 404:
            return ConfigError(
                f"{record_name}'s schema is not registered at {self.url} and "
                "RUNLOG_SCHEMA_REGISTRY_AUTO_REGISTER is false: run `runlog schemas register`")
        return ConfigError(f"schema registry {self.url} refused {record_name}'s schema: "
                           f"{err.error_message} (HTTP {err.http_status_code})")

    def writer(self, sid: int, known: Mapping[bytes, Writer], records: Container[str]) -> Writer:
        """The writer schema registered under ``sid``: one of ``known`` (by fingerprint) when it is
        one, so the current schema decodes without resolution; it must be one of ``records``.

        Raises:
            DecodeError: ``unknown_schema`` (no such id, or not an Avro record schema) or
                ``wrong_type`` (not a Runlog record).
            RegistryUnavailable: the registry did not answer.
        """
        w = self._writers.get(sid)
        if w is not None:
            return w
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        from runlog.schemas._registry_client import registry_error

        try:
            registered = self.registry.get_schema(sid)
        except Exception as err:
            # Only the registry's own "no such id" makes the record undecodable (a dead letter);
            # an unreachable registry is raised as such, so no good record is dead-lettered for it.
            mapped = registry_error(err, self.url, f"fetching schema id {sid}")
            if mapped is not None:
                raise mapped from err
            if isinstance(err, SchemaRegistryError):
                raise DecodeError("unknown_schema", f"registry has no schema id {sid}: {err}") from err
            raise
        try:
            doc = json.loads(registered.schema_str)
            w = writer_for(doc)
        except (ValueError, TypeError, KeyError, SchemaParseException, UnknownType) as err:
            raise DecodeError("unknown_schema", f"registry schema id {sid} is not an Avro record schema: "
                              f"{type(err).__name__}: {err}") from err
        if w.record_name not in records:
            raise DecodeError("wrong_type", f"registry id {sid} is {w.record_name}, not a Runlog record")
        w = known.get(w.fingerprint, w)
        self._writers[sid] = w
        return w

    def schema_by_fingerprint(self, fp: bytes, records: Iterable[str]) -> dict[str, Any] | None:
        """The schema registered under one of the subjects ``records`` whose single-object
        fingerprint is ``fp`` (a record written without the registry by a writer of another
        version), or None. Reads every version of those subjects once per unknown fingerprint.

        Raises:
            RegistryUnavailable: the registry did not answer.
        """
        doc = self._docs_by_fp.get(fp)
        if doc is not None:
            return doc
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        from runlog.schemas._registry_client import registry_error

        for subject in records:
            try:
                versions = list(self.registry.get_versions(subject))
                for v in versions:
                    registered = self.registry.get_version(subject, v)
                    try:
                        found = json.loads(registered.schema.schema_str)
                        w = writer_for(found)
                    except (ValueError, TypeError, KeyError, AttributeError, SchemaParseException,
                            UnknownType):
                        continue
                    self._docs_by_fp[w.fingerprint] = found
            except Exception as err:
                mapped = registry_error(err, self.url, f"reading the versions of {subject}")
                if mapped is not None:
                    raise mapped from err
                if isinstance(err, SchemaRegistryError):
                    continue  # no such subject (404): nothing registered under it
                raise
        return self._docs_by_fp.get(fp)
