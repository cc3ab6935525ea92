"""The Schema Registry: the client Runlog builds from its settings, the codec that writes through
it, and publishing the contract (``runlog schemas register``).

With ``RUNLOG_SCHEMA_REGISTRY_URL`` set, :meth:`Codec.from_settings <schemas.Codec.from_settings>`
(through :func:`registry_codec`) gives a codec that writes the registry's wire format and reads
both framings. One client and one codec are kept per registry configuration in a process, so a
schema id is registered or looked up once and a writer schema fetched once, and ``mock://NAME``
(confluent-kafka's in-process registry) is the same registry to every writer and reader of the
process. The registry is asked once when the codec is made: an unreachable one is a
:class:`RegistryUnavailable` (a :class:`~schemas.errors.ConfigError`: the CLI prints one line and
exits 2), as is a registry that stops answering later; a registry that refuses the credentials is a
:class:`~schemas.errors.ConfigError` too. No credential is put in an error or a log line.

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

import contextlib
import functools
import importlib
import json
import re
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from confluent_kafka.schema_registry import (
    ConfigCompatibilityLevel,
    Schema,
    SchemaRegistryClient,
    ServerConfig,
)
from confluent_kafka.schema_registry.error import OAuthTokenError, SchemaRegistryError

from schemas._codec import _RECORD_FILES, Codec, load_past_schemas, load_schema
from schemas.errors import ConfigError, RunlogError
from schemas.settings import Settings, redact_urls

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


class RegistryUnavailable(ConfigError):
    """The Schema Registry could not be reached (connection refused, timeout, TLS failure, 5xx).

    Attributes:
        url: the registry's URL, credentials masked.
        detail: what failed.
    """

    def __init__(self, url: str, detail: str) -> None:
        self.url = url
        self.detail = detail
        super().__init__(f"schema registry {url} unreachable: {detail}")


@dataclass(frozen=True, slots=True)
class Registered:
    """One subject after registration: the current schema's id and version, the subject's level."""

    subject: str
    schema_id: int
    version: int
    compatibility: str


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP library's "no answer" errors (confluent-kafka uses httpx2 or httpx, whichever
    is installed), plus the OS's and TLS's own."""
    found: list[type[BaseException]] = [ssl.SSLError, OSError]
    for name in ("confluent_kafka.schema_registry.common._httpx_compat", "httpx2", "httpx"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        lib = getattr(mod, "httpx", mod)
        found += [c for c in (getattr(lib, "TransportError", None), getattr(lib, "InvalidURL", None))
                  if isinstance(c, type) and issubclass(c, BaseException)]
        break
    return tuple(found)


_TRANSPORT_ERRORS = _transport_errors()
_USERINFO = re.compile(r"//([^/@\s:]*):[^/@\s]*@")


def _scrub(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@`` in it masked."""
    return _USERINFO.sub(r"//\1:***@", text)


def _one_line(text: str) -> str:
    return " ".join(_scrub(text).split())


def registry_error(err: Exception, url: str, action: str) -> RunlogError | None:
    """The Runlog error for an exception a registry call raised, or None for an answer the caller
    handles itself (a 4xx other than 401/403: not found, incompatible, invalid).

    Args:
        err: what the confluent-kafka client raised.
        url: the registry's URL, credentials masked (:func:`~schemas.settings.redact_urls`).
        action: what was asked, for the message (``"registering runlog.RunEvent"``).
    """
    if isinstance(err, SchemaRegistryError):
        status = err.http_status_code
        if status in (401, 403):
            return ConfigError(
                f"schema registry {url} refused {action}: HTTP {status} {_one_line(str(err.error_message))} "
                "(check RUNLOG_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO or the bearer settings)")
        if status is None or status < 0 or status >= 500 or status in (408, 429):
            return RegistryUnavailable(url, f"{action}: HTTP {status} {_one_line(str(err.error_message))}")
        return None
    if isinstance(err, OAuthTokenError):
        return ConfigError(f"schema registry {url}: no bearer token for {action}: {_one_line(str(err))}")
    if isinstance(err, _TRANSPORT_ERRORS):
        detail = _one_line(str(err)) or "no detail"
        return RegistryUnavailable(url, f"{action}: {type(err).__name__}: {detail}")
    return None


def _call(url: str, action: str, fn: Callable[[], T]) -> T:
    """``fn()``, its registry failures turned into Runlog errors (4xx answers stay as they are)."""
    try:
        return fn()
    except Exception as err:
        mapped = registry_error(err, url, action)
        if mapped is None:
            raise
        raise mapped from err


_LOCK = threading.Lock()
_CLIENTS: dict[tuple[Any, ...], SchemaRegistryClient] = {}
_CODECS: dict[tuple[Any, ...], Codec] = {}


def _client_key(settings: Settings) -> tuple[Any, ...]:
    return (settings.schema_registry_url, tuple(sorted(settings.schema_registry_extra.items())))


def registry_client(settings: Settings) -> SchemaRegistryClient:
    """The process's client for ``RUNLOG_SCHEMA_REGISTRY_URL`` and the ``RUNLOG_SCHEMA_REGISTRY_<KEY>``
    settings (``mock://NAME`` gives confluent-kafka's in-memory registry, one per name). Makes no
    request.

    Raises:
        ConfigError: no URL, or a client setting the client refuses (its message names it).
    """
    conf = settings.schema_registry_config()
    key = _client_key(settings)
    with _LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            try:
                client = SchemaRegistryClient.new_client(conf)
            except (ValueError, TypeError) as err:
                raise ConfigError(f"Schema Registry client settings: {_one_line(str(err))}") from None
            except (OSError, ssl.SSLError) as err:  # a CA, certificate or key file that cannot be loaded
                raise ConfigError(f"Schema Registry TLS files (RUNLOG_SCHEMA_REGISTRY_SSL_*): "
                                  f"{type(err).__name__}: {_one_line(str(err))}") from None
            _CLIENTS[key] = client
        return client


def check_registry(client: SchemaRegistryClient, url: str) -> None:
    """Ask the registry one question (its subjects), so an unreachable one or refused credentials
    show at start. A 4xx answer other than 401/403 still shows that it is there.

    Raises:
        RegistryUnavailable: no answer (or 5xx).
        ConfigError: the credentials were refused.
    """
    with contextlib.suppress(SchemaRegistryError):
        _call(url, "listing subjects", client.get_subjects)


def registry_codec(settings: Settings) -> Codec:
    """The process's codec for the registry of ``settings`` (writes its wire format, reads both
    framings), made once per registry configuration, ``RUNLOG_SCHEMA_REGISTRY_AUTO_REGISTER`` and
    ``RUNLOG_MAX_RECORD_BYTES``; the first call checks that the registry answers.

    Raises:
        RegistryUnavailable: the registry did not answer.
        ConfigError: no URL, client settings refused, or credentials refused.
    """
    key = (*_client_key(settings), settings.schema_registry_auto_register, settings.max_record_bytes)
    with _LOCK:
        codec = _CODECS.get(key)
    if codec is not None:
        return codec
    client = registry_client(settings)
    url = redact_urls(settings.schema_registry_url or "")
    check_registry(client, url)
    codec = Codec(client, max_record_bytes=settings.max_record_bytes,
                  auto_register=settings.schema_registry_auto_register, registry_url=url)
    with _LOCK:
        return _CODECS.setdefault(key, codec)


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
