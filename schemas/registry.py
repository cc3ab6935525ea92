"""The Schema Registry: the client Runlog builds from its settings, the codec that writes through
it, and publishing the contract (``runlog schemas register``).

With ``RUNLOG_SCHEMA_REGISTRY_URL`` set, :meth:`Codec.from_settings <runlog.schemas.Codec.from_settings>`
(through :func:`registry_codec`) gives a codec that writes the registry's wire format and reads
both framings. One client and one codec are kept per registry configuration in a process, so a
schema id is registered or looked up once and a writer schema fetched once, and ``mock://NAME``
(confluent-kafka's in-process registry) is the same registry to every writer and reader of the
process. The registry is asked once when the codec is made: an unreachable one is a
:class:`RegistryUnavailable` (a :class:`~runlog.schemas.errors.ConfigError`: the CLI prints one line and
exits 2), as is a registry that stops answering later; a registry that refuses the credentials is a
:class:`~runlog.schemas.errors.ConfigError` too. No credential is put in an error or a log line.

Subjects follow the record name strategy, as the codec's registry framing does
(``runlog.RunEvent``, ``runlog.Checkpoint``, ``runlog.Effect``,
``runlog.ResumeRequest``). :func:`register_schemas` sets each subject's compatibility level
(BACKWARD by default: consumers on the new schema read data written with the old one)
before its versions are registered, oldest first, so the registry checks every
step of the schema's history; a subject that has versions already (a writer registered the
current schema on first use) gets only the current schema, so no past one becomes its latest.
Registering again is a no-op: the registry returns the existing ids.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import TypeVar

from confluent_kafka.schema_registry import (
    ConfigCompatibilityLevel,
    Schema,
    SchemaRegistryClient,
    ServerConfig,
)
from confluent_kafka.schema_registry.error import SchemaRegistryError

from runlog.schemas._codec import _RECORD_FILES, load_past_schemas, load_schema, registry_codec
from runlog.schemas._registry_client import (
    RegistryUnavailable,
    _call,
    _one_line,
    check_registry,
    registry_client,
    registry_error,
)
from runlog.schemas.errors import ConfigError, RunlogError
from runlog.schemas.settings import redact_urls

__all__ = [
    "SUBJECTS",
    "Registered",
    "RegistryUnavailable",
    "check_registry",
    "register_schemas",
    "registry_client",
    "registry_codec",
    "registry_error",
]

SUBJECTS: tuple[str, ...] = tuple(_RECORD_FILES)
"""Every record subject Runlog registers."""

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Registered:
    """One subject after registration: the current schema's id and version, the subject's level."""

    subject: str
    schema_id: int
    version: int
    compatibility: str


def _versions(client: SchemaRegistryClient, url: str, subject: str) -> list[int]:
    """The subject's registered versions ([] for a subject the registry does not have)."""
    try:
        return list(_call(url, f"reading the versions of {subject}",
                          functools.partial(client.get_versions, subject)))
    except SchemaRegistryError as err:
        if err.http_status_code == 404:
            return []
        raise


def register_schemas(client: SchemaRegistryClient, *, compatibility: str = "BACKWARD",
                     url: str | None = None) -> list[Registered]:
    """Set each subject's compatibility, then register its past and current schemas (oldest first;
    only the current one when the subject has versions already). Each :class:`Registered` names
    the current schema's id and version.

    Raises:
        RegistryUnavailable: the registry did not answer (``url`` names it in the message).
        ConfigError: an unknown compatibility level, or the credentials were refused.
        RunlogError: the registry refused a schema or a setting (for example an incompatible change).
    """
    if url is None:
        conf = client.config()
        url = redact_urls(str(conf.get("url") or "")) if isinstance(conf, dict) else "(unnamed)"
    try:
        wanted = ConfigCompatibilityLevel(compatibility.upper())
    except ValueError:
        raise ConfigError(f"unknown compatibility level {compatibility!r}") from None
    out: list[Registered] = []
    for subject in SUBJECTS:
        try:
            _call(url, f"setting the compatibility of {subject}", functools.partial(
                client.set_config, subject_name=subject, config=ServerConfig(compatibility=wanted)))
            existing = _versions(client, url, subject)
            current = Schema(json.dumps(load_schema(subject)), "AVRO")
            # A new subject gets the whole history, oldest first. One that has versions already (a
            # writer registered the current schema on first use, say) gets only the current schema:
            # a past one registered now would become its latest version.
            past = [] if existing else load_past_schemas(subject)
            for schema in [*(Schema(json.dumps(d), "AVRO") for d in past), current]:
                _call(url, f"registering {subject}",
                      functools.partial(client.register_schema, subject, schema))
            found = _call(url, f"reading {subject}",
                          functools.partial(client.lookup_schema, subject, current))
            config = _call(url, f"reading the config of {subject}",
                           functools.partial(client.get_config, subject))
        except SchemaRegistryError as err:
            raise RunlogError(f"schema registry refused {subject}: {_one_line(str(err))}") from err
        # confluent-kafka's mock:// client keeps no config: it answers None.
        level = config.compatibility if config is not None and config.compatibility is not None else wanted
        out.append(Registered(subject, int(found.schema_id or 0), int(found.version or 0), level.value))
    return out
