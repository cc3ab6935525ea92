"""The keys a deployment's settings name: :func:`subject_keys` (one :class:`SubjectKeys` per process and
configuration) over :func:`key_provider` (the local keyring's files or a transit engine)."""

from __future__ import annotations

import os
import threading

from runlog.producers.base._keyring import KeyProvider, LocalKeyProvider, SubjectKeys
from runlog.producers.base._transit import TransitKeyProvider
from runlog.schemas.errors import ConfigError
from runlog.schemas.settings import Settings

__all__ = ["key_provider", "subject_keys"]


def key_provider(settings: Settings) -> KeyProvider:
    """The KEK provider ``settings`` name (``RUNLOG_KEY_PROVIDER``): the local keyring's files, or a
    transit engine (:class:`~runlog.producers.base._transit.TransitKeyProvider`).

    Raises:
        ConfigError: ``transit`` without an address or a token.
    """
    if settings.key_provider == "transit":
        if not settings.transit_addr or not settings.transit_token:
            raise ConfigError("RUNLOG_KEY_PROVIDER=transit needs RUNLOG_TRANSIT_ADDR and "
                              "RUNLOG_TRANSIT_TOKEN")
        return TransitKeyProvider(settings.transit_addr, settings.transit_token, mount=settings.transit_mount,
                                  key=settings.transit_key)
    return LocalKeyProvider(settings.keyring)


def subject_keys(settings: Settings) -> SubjectKeys:
    """The subjects' data keys of ``settings`` (its keyring and KEK provider), one per process and
    configuration: unwrapped keys are cached once for all its readers and writers."""
    ident = (os.path.abspath(settings.keyring), settings.key_provider, settings.transit_addr,
             settings.transit_mount, settings.transit_key, settings.transit_token)
    with _KEYS_LOCK:
        keys = _KEYS.get(ident)
        if keys is None:
            if len(_KEYS) >= 64:
                _KEYS.clear()
            keys = _KEYS[ident] = SubjectKeys(settings.keyring, key_provider(settings))
        return keys


_KEYS: dict[tuple[str | None, ...], SubjectKeys] = {}
_KEYS_LOCK = threading.Lock()
