"""The console's protections: the action token, cross-site request checks, the Host check, secrets.

* **Token.** Every action presents ``RUNLOG_CONSOLE_TOKEN`` (compared in constant time);
  without a configured token every action is refused. On a non-loopback address the pages
  too need a session signed in with the token.
* **Cross-site requests.** A POST must come from the console's own origin (``Origin``, else
  ``Referer``; ``Sec-Fetch-Site`` when the browser sends it) and carry a CSRF token bound to
  the session cookie (an HMAC of the cookie under a per-process key). The cookie is
  ``HttpOnly`` and ``SameSite=Strict``.
* **Host.** Bound to a loopback address, the console answers only requests naming a
  loopback host, so a DNS-rebinding page cannot read it.
* **Secrets.** Every credential the settings hold (passwords, tokens, SASL/TLS secrets, the
  password in a Redis or Schema Registry URL) is masked out of every response body.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import web

from runlog.schemas import Settings

__all__ = ["COOKIE", "Guard", "Refusal", "is_loopback", "secrets_of"]

COOKIE = "runlog_console"
"""The session cookie: a random id, the CSRF token is bound to it."""

SESSION_TTL_S = 12 * 3600
"""How long a sign-in (needed for reads on a non-loopback address) lasts."""

_SECRET_KEY_HINTS = ("password", "secret", "token", "key", "jaas", "oauthbearer", "credential", "pem",
                     "username")
_MIN_SECRET = 4
"""Shorter values are not masked (masking two letters everywhere would garble every page)."""

_LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine only."""
    h = host.strip("[]").lower()
    if h in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def secrets_of(settings: Settings) -> list[str]:
    """Every credential in ``settings``, longest first (so a secret containing another is masked whole)."""
    found: set[str] = set()
    for url in (settings.redis_url, settings.schema_registry_url or ""):
        parts = urlsplit(url)
        if parts.password:
            found.add(parts.password)
    for v in (settings.redis_password, settings.redis_ssl_key_password, settings.console_token):
        if v:
            found.add(v)
    for k, v in settings.kafka_extra.items():
        if v and any(h in k.lower() for h in _SECRET_KEY_HINTS):
            found.add(str(v))
    for k, v in settings.schema_registry_extra.items():  # basic.auth.user.info is user:password
        if v and any(h in k.lower() for h in (*_SECRET_KEY_HINTS, "user.info")):
            found.update({str(v), str(v).partition(":")[2]} if k == "basic.auth.user.info" else {str(v)})
    return sorted((s for s in found if len(s) >= _MIN_SECRET), key=len, reverse=True)


@dataclass(frozen=True)
class Refusal:
    """Why a request was refused: the HTTP status and a message for the person."""

    status: int
    message: str


class Guard:
    """Checks requests and masks responses (see the module docstring)."""

    def __init__(self, settings: Settings, *, host: str) -> None:
        self._token = settings.console_token
        self._key = secrets.token_bytes(32)
        self.loopback = is_loopback(host)
        self._signed_in: dict[str, float] = {}
        self._secrets = [s.encode("utf-8") for s in secrets_of(settings)]

    @property
    def token_configured(self) -> bool:
        return bool(self._token)

    @property
    def reads_need_sign_in(self) -> bool:
        return not self.loopback

    # -- the session and its CSRF token ---------------------------------------------------------

    @staticmethod
    def new_session() -> str:
        return secrets.token_urlsafe(32)

    def csrf_for(self, session: str) -> str:
        return hmac.new(self._key, b"csrf:" + session.encode(), hashlib.sha256).hexdigest()

    def signed_in(self, session: str | None) -> bool:
        if session is None:
            return False
        until = self._signed_in.get(session, 0.0)
        return until > time.monotonic()

    def sign_in(self, session: str) -> None:
        now = time.monotonic()
        self._signed_in = {s: t for s, t in self._signed_in.items() if t > now}
        self._signed_in[session] = now + SESSION_TTL_S

    def sign_out(self, session: str | None) -> None:
        if session is not None:
            self._signed_in.pop(session, None)

    # -- checks ---------------------------------------------------------------------------------

    def check_host(self, request: web.Request) -> Refusal | None:
        """Bound to loopback, only loopback host names are answered (no DNS rebinding)."""
        if not self.loopback:
            return None
        host = urlsplit(f"//{request.host}").hostname or ""
        if is_loopback(host):
            return None
        return Refusal(421, f"this console answers only for 127.0.0.1 / localhost, not {host!r}")

    def check_same_origin(self, request: web.Request) -> Refusal | None:
        """A state-changing request must come from a page of this console."""
        own = f"{request.scheme}://{request.host}"
        site = request.headers.get("Sec-Fetch-Site")
        if site is not None and site != "same-origin":
            return Refusal(403, f"cross-site request refused (Sec-Fetch-Site: {site})")
        origin = request.headers.get("Origin")
        if origin is not None:
            if origin != own:
                return Refusal(403, f"cross-site request refused: Origin {origin!r} is not {own!r}")
            return None
        referer = request.headers.get("Referer")
        if referer is None:
            return Refusal(403, "request refused: neither Origin nor Referer says it came from this console")
        parts = urlsplit(referer)
        if f"{parts.scheme}://{parts.netloc}" != own:
            return Refusal(403, "cross-site request refused: the Referer is not this console")
        return None

    def check_csrf(self, session: str | None, presented: str | None) -> Refusal | None:
        if not session or not presented:
            return Refusal(403, "request refused: the form's CSRF token or the session cookie is missing "
                           "(reload the page)")
        if not hmac.compare_digest(self.csrf_for(session), presented):
            return Refusal(403, "request refused: the form's CSRF token does not belong to this session "
                           "(reload the page)")
        return None

    def check_token(self, presented: str | None) -> Refusal | None:
        if not self._token:
            return Refusal(403, "actions are disabled: RUNLOG_CONSOLE_TOKEN is not set for this console "
                           "(set it and restart the console; reading needs no token)")
        if not presented:
            return Refusal(403, "the console token is required for every action")
        if not hmac.compare_digest(self._token.encode("utf-8"), presented.encode("utf-8")):
            return Refusal(403, "wrong console token")
        return None

    # -- responses ------------------------------------------------------------------------------

    def mask(self, body: bytes) -> bytes:
        """``body`` with every credential of the settings replaced by ``***``."""
        for s in self._secrets:
            if s in body:
                body = body.replace(s, b"***")
        return body

    def mask_text(self, text: str) -> str:
        return self.mask(text.encode("utf-8")).decode("utf-8")
