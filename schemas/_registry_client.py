"""The Schema Registry client Runlog builds from its settings, and its failures as Runlog errors.

Shared by the codec (which fetches and registers writer schemas through it) and
:mod:`runlog.schemas.registry` (publishing the contract); it imports neither.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import ssl
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.error import OAuthTokenError, SchemaRegistryError

from runlog.schemas.errors import ConfigError, RunlogError
from runlog.schemas.settings import Settings

__all__ = ["RegistryUnavailable", "check_registry", "client_key", "registry_client", "registry_error"]

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
        url: the registry's URL, credentials masked (:func:`~runlog.schemas.settings.redact_urls`).
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


def client_key(settings: Settings) -> tuple[Any, ...]:
    return (settings.schema_registry_url, tuple(sorted(settings.schema_registry_extra.items())))


def registry_client(settings: Settings) -> SchemaRegistryClient:
    """The process's client for ``RUNLOG_SCHEMA_REGISTRY_URL`` and the ``RUNLOG_SCHEMA_REGISTRY_<KEY>``
    settings (``mock://NAME`` gives confluent-kafka's in-memory registry, one per name). Makes no
    request.

    Raises:
        ConfigError: no URL, or a client setting the client refuses (its message names it).
    """
    conf = settings.schema_registry_config()
    key = client_key(settings)
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
