"""A key provider on HashiCorp Vault's or OpenBao's transit engine: the KEK never leaves the server.

:class:`TransitKeyProvider` maps :class:`~runlog.producers.base._keyring.KeyProvider` onto the engine's
HTTP API (``/v1/<mount>/...``, token in the ``X-Vault-Token`` header):

=====================  =============================================================================
``wrap``               ``POST <mount>/encrypt/<key>``
                       ``{"plaintext": b64(data key), "context": b64(key id)}``;
                       the ``ciphertext`` it returns (``vault:v<N>:...``) is the wrapped key, ``N`` its
                       KEK version
``unwrap``             ``POST <mount>/decrypt/<key>`` ``{"ciphertext", "context"}`` -> ``plaintext``
``rotate``             ``POST <mount>/keys/<key>/rotate``, then the key's ``latest_version``
``current_version``    ``GET <mount>/keys/<key>`` -> ``latest_version``
``retire(below)``      ``POST <mount>/keys/<key>/config`` ``{"min_decryption_version": below}``: older
                       versions no longer decrypt (``trim`` on the server destroys them for good)
=====================  =============================================================================

Create the key as ``aes256-gcm96`` with ``derived=true``: the subject's key id is then the derivation
context, so a wrapped key moved to another subject does not unwrap. The token comes from the settings
(``RUNLOG_TRANSIT_TOKEN``) and is never logged nor put in an error; every request has a timeout; an
error from the server is raised as :class:`~runlog.schemas.errors.PayloadKeyError` (a refused token:
:class:`~runlog.schemas.errors.ConfigError`, naming the status, never the token).
"""

from __future__ import annotations

import base64
import json
import re
import urllib.error
import urllib.request
from typing import Any

from runlog.producers.base._keyring import KeyProvider, WrappedKey
from runlog.schemas.errors import ConfigError, PayloadKeyError

__all__ = ["TransitKeyProvider"]

_CIPHERTEXT = re.compile(r"^vault:v(\d+):")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class TransitKeyProvider(KeyProvider):
    """Data keys wrapped by a transit key of Vault or OpenBao.

    Args:
        addr: the server's address (``http(s)://host:8200``).
        token: the token sent as ``X-Vault-Token`` (a secret: kept out of ``repr`` and of errors).
        mount: the path the transit engine is mounted at.
        key: the transit key's name.
        timeout: seconds per request.
    """

    def __init__(self, addr: str, token: str, *, mount: str = "transit", key: str = "runlog",
                 timeout: float = 10.0) -> None:
        if not addr.startswith(("http://", "https://")):
            raise ConfigError(f"transit address must be http(s)://host:port, got {addr!r}")
        self.addr = addr.rstrip("/")
        self.mount = mount.strip("/")
        self.key = key
        self.timeout = timeout
        self.__token = token

    def __repr__(self) -> str:
        return f"TransitKeyProvider(addr={self.addr!r}, mount={self.mount!r}, key={self.key!r})"

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None, *,
              context: str = "?") -> dict[str, Any]:
        url = f"{self.addr}/v1/{self.mount}/{path}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method,
                                     headers={"X-Vault-Token": self.__token,
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as err:
            detail = "; ".join(_errors_of(err.read()))
            if err.code in (401, 403):
                raise ConfigError(f"transit at {self.addr} refused the token ({err.code} on {method} "
                                  f"{self.mount}/{path}){': ' + detail if detail else ''}") from None
            raise PayloadKeyError(context, f"transit {method} {self.mount}/{path}: {err.code}"
                                           f"{': ' + detail if detail else ''}") from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise PayloadKeyError(context, f"transit at {self.addr} unreachable: {reason}") from None
        if not raw:
            return {}
        doc: dict[str, Any] = json.loads(raw)
        return doc

    def wrap(self, data_key: bytes, context: str) -> WrappedKey:
        doc = self._call("POST", f"encrypt/{self.key}", {"plaintext": _b64(data_key),
                                                          "context": _b64(context.encode())}, context=context)
        ciphertext = str(doc.get("data", {}).get("ciphertext", ""))
        m = _CIPHERTEXT.match(ciphertext)
        if m is None:
            raise PayloadKeyError(context, "transit encrypt returned no vault:v<N>: ciphertext")
        return WrappedKey(int(m.group(1)), ciphertext.encode("ascii"))

    def unwrap(self, wrapped: WrappedKey, context: str) -> bytes:
        doc = self._call("POST", f"decrypt/{self.key}", {"ciphertext": wrapped.blob.decode("ascii"),
                                                          "context": _b64(context.encode())}, context=context)
        plaintext = doc.get("data", {}).get("plaintext")
        if not isinstance(plaintext, str):
            raise PayloadKeyError(context, "transit decrypt returned no plaintext")
        return base64.b64decode(plaintext)

    def current_version(self) -> int:
        doc = self._call("GET", f"keys/{self.key}")
        return int(doc.get("data", {}).get("latest_version", 0))

    def rotate(self) -> int:
        self._call("POST", f"keys/{self.key}/rotate", {})
        return self.current_version()

    def retire(self, below: int) -> list[int]:
        info = self._call("GET", f"keys/{self.key}").get("data", {})
        current = int(info.get("latest_version", 0))
        if below > current:
            raise ConfigError(f"cannot retire KEK versions up to the current one (v{current})")
        before = int(info.get("min_decryption_version", 1))
        self._call("POST", f"keys/{self.key}/config", {"min_decryption_version": below})
        return list(range(before, below))


def _errors_of(raw: bytes) -> list[str]:
    try:
        errs = json.loads(raw).get("errors", [])
    except (ValueError, AttributeError):
        return []
    return [str(e)[:200] for e in errs] if isinstance(errs, list) else []
