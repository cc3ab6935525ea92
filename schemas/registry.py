"""Publishing the contract to a Confluent-compatible Schema Registry (``runlog schemas register``).

Subjects follow the record name strategy, as the codec's registry framing does
(``runlog.RunEvent``, ``runlog.Checkpoint``, ``runlog.Effect``,
``runlog.ResumeRequest``). Each subject's compatibility level is set (BACKWARD
by default: consumers on the new schema read data written with the old one)
before its versions are registered, oldest first, so the registry checks every
step of the schema's history. Registering again is a no-op: the registry returns
the existing ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from confluent_kafka.schema_registry import (
    ConfigCompatibilityLevel,
    Schema,
    SchemaRegistryClient,
    ServerConfig,
)
from confluent_kafka.schema_registry.error import SchemaRegistryError

from schemas._codec import _RECORD_FILES, load_past_schemas, load_schema
from schemas.errors import ConfigError, RunlogError
from schemas.settings import Settings

__all__ = ["SUBJECTS", "Registered", "register_schemas", "registry_client"]

SUBJECTS: tuple[str, ...] = tuple(_RECORD_FILES)
"""Every record subject Runlog registers."""


@dataclass(frozen=True, slots=True)
class Registered:
    """One subject after registration: the current schema's id and version, the subject's level."""

    subject: str
    schema_id: int
    version: int
    compatibility: str


def registry_client(settings: Settings) -> SchemaRegistryClient:
    """A client for ``RUNLOG_SCHEMA_REGISTRY_URL`` (``mock://...`` gives confluent-kafka's in-memory one)."""
    if not settings.schema_registry_url:
        raise ConfigError("RUNLOG_SCHEMA_REGISTRY_URL is not set")
    url = settings.schema_registry_url
    if url.startswith("mock://"):
        return SchemaRegistryClient.new_client({"url": url})
    return SchemaRegistryClient({"url": url})


def register_schemas(client: SchemaRegistryClient, *, compatibility: str = "BACKWARD") -> list[Registered]:
    """Set each subject's compatibility, then register its past and current schemas (oldest first).

    Raises:
        RunlogError: the registry refused a schema or a setting (for example an incompatible change).
    """
    try:
        wanted = ConfigCompatibilityLevel(compatibility.upper())
    except ValueError:
        raise ConfigError(f"unknown compatibility level {compatibility!r}") from None
    out: list[Registered] = []
    for subject in SUBJECTS:
        try:
            client.set_config(subject_name=subject, config=ServerConfig(compatibility=wanted))
            schema_id = 0
            for doc in [*load_past_schemas(subject), load_schema(subject)]:
                schema_id = client.register_schema(subject, Schema(json.dumps(doc), "AVRO"))
            latest = client.get_latest_version(subject)
            config = client.get_config(subject)
        except SchemaRegistryError as err:
            raise RunlogError(f"schema registry refused {subject}: {err}") from err
        # confluent-kafka's mock:// client keeps no config: it answers None.
        level = config.compatibility if config is not None and config.compatibility is not None else wanted
        out.append(Registered(subject, int(schema_id), int(latest.version or 0), level.value))
    return out
