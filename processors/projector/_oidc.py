"""SASL/OAUTHBEARER for the projector's Kafka client as librdkafka's ``sasl.oauthbearer.method=oidc``
does it: :class:`OidcTokenProvider` fetches tokens from an OAuth 2 token endpoint with the client
credentials grant, and :func:`oidc_provider` builds one from the ``sasl.oauthbearer.*`` settings,
refusing what it cannot honour."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping

from aiokafka.abc import AbstractTokenProvider  # type: ignore[import-untyped]

from runlog.processors.projector._keys import env_name, refuse
from runlog.schemas.errors import ConfigError

__all__ = ["OidcTokenProvider", "oidc_provider"]


class OidcTokenProvider(AbstractTokenProvider):  # type: ignore[misc]
    """SASL/OAUTHBEARER tokens from an OAuth 2 token endpoint with the client credentials grant,
    as librdkafka's ``sasl.oauthbearer.method=oidc``: a POST of ``grant_type=client_credentials``
    (and ``scope``) with HTTP Basic client authentication, the ``access_token`` of the JSON answer,
    reused until 80% of its lifetime (the JWT ``exp``, else ``expires_in``, else 5 minutes)."""

    def __init__(self, url: str, client_id: str, client_secret: str, *, scope: str | None = None,
                 extensions: Mapping[str, str] | None = None, context: ssl.SSLContext | None = None,
                 timeout: float = 30.0) -> None:
        self.url = url
        self.scope = scope
        self._auth = "Basic " + base64.b64encode(f"{client_id}:{client_secret}".encode()).decode()
        self._extensions = dict(extensions or {})
        self._context = context
        self._timeout = timeout
        self._token: str | None = None
        self._refresh_at = 0.0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"OidcTokenProvider(url={self.url!r}, scope={self.scope!r})"

    async def token(self) -> str:
        return await asyncio.get_running_loop().run_in_executor(None, self.token_now)

    def token_now(self) -> str:
        """A valid access token, fetched when there is none or it is due for refresh (blocking)."""
        with self._lock:
            if self._token is None or time.time() >= self._refresh_at:
                self._token, lifetime = self._fetch()
                self._refresh_at = time.time() + 0.8 * lifetime
            return self._token

    def extensions(self) -> dict[str, str]:
        return dict(self._extensions)

    def _fetch(self) -> tuple[str, float]:
        form = {"grant_type": "client_credentials", **({"scope": self.scope} if self.scope else {})}
        req = urllib.request.Request(
            self.url, data=urllib.parse.urlencode(form).encode(), method="POST",
            headers={"Authorization": self._auth, "Accept": "application/json",
                     "Content-Type": "application/x-www-form-urlencoded"})
        try:
            with urllib.request.urlopen(req, timeout=self._timeout, context=self._context) as resp:
                doc = json.loads(resp.read())
        except (OSError, ValueError) as err:  # URLError, HTTPError and timeouts are OSErrors
            raise ConnectionError(f"OAUTHBEARER token request to {self.url} failed: {err}") from None
        token = doc.get("access_token") if isinstance(doc, dict) else None
        if not isinstance(token, str) or not token:
            raise ConnectionError(f"OAUTHBEARER token endpoint {self.url} answered without an access_token")
        now = time.time()
        exp = _jwt_exp(token)
        if exp is not None:
            return token, max(exp - now, 1.0)
        expires_in = doc.get("expires_in")
        return token, float(expires_in) if isinstance(expires_in, int | float) and expires_in > 0 else 300.0


def _jwt_exp(token: str) -> float | None:
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, TypeError):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    return float(exp) if isinstance(exp, int | float) else None


def oidc_provider(extra: Mapping[str, str]) -> OidcTokenProvider:
    method = str(extra.get("sasl.oauthbearer.method", "default")).strip().lower()
    if method != "oidc":
        raise refuse("sasl.oauthbearer.method", f"OAUTHBEARER with method {method!r} needs an in-process "
                      "token callback or librdkafka's unsecured development tokens; set "
                      "sasl.oauthbearer.method=oidc with a client id, secret and token endpoint")
    grant = str(extra.get("sasl.oauthbearer.grant.type", "client_credentials")).strip()
    if grant != "client_credentials":
        raise refuse("sasl.oauthbearer.grant.type", f"{grant!r} is not supported; use client_credentials")
    imds = str(extra.get("sasl.oauthbearer.metadata.authentication.type", "none")).strip().lower()
    if imds != "none":
        raise refuse("sasl.oauthbearer.metadata.authentication.type", f"{imds!r} is not supported")
    alias = "sasl.oauthbearer.client.credentials."
    client_id = extra.get("sasl.oauthbearer.client.id") or extra.get(alias + "client.id")
    secret = extra.get("sasl.oauthbearer.client.secret") or extra.get(alias + "client.secret")
    url = extra.get("sasl.oauthbearer.token.endpoint.url")
    missing = [k for k, v in (("sasl.oauthbearer.client.id", client_id),
                              ("sasl.oauthbearer.client.secret", secret),
                              ("sasl.oauthbearer.token.endpoint.url", url)) if not v]
    if missing:
        raise ConfigError("sasl.oauthbearer.method=oidc needs "
                          + ", ".join(f"{env_name(k)} ({k})" for k in missing))
    assert client_id and secret and url
    extensions: dict[str, str] = {}
    listed = str(extra.get("sasl.oauthbearer.extensions", "")).split(",")
    for item in filter(None, (p.strip() for p in listed)):
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise refuse("sasl.oauthbearer.extensions", f"{item!r} is not key=value")
        extensions[name.strip()] = value.strip()
    context = None
    if url.lower().startswith("https:"):
        context = ssl.create_default_context(cafile=extra.get("https.ca.location") or None,
                                             cadata=extra.get("https.ca.pem") or None)
    return OidcTokenProvider(url, client_id, secret, scope=extra.get("sasl.oauthbearer.scope") or None,
                             extensions=extensions, context=context)
