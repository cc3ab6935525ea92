"""librdkafka security settings (``RUNLOG_KAFKA_*``) translated for the projector's Kafka client.

The projector runs on Faust, whose Kafka client is aiokafka, not librdkafka: every setting the
other clients receive verbatim must be translated, or the projector would connect with weaker
security than them (or fail, as an inline ``ssl.ca.pem`` did). :func:`broker_credentials` does it,
key by key, and refuses (:class:`~schemas.errors.ConfigError` naming the setting) every key it
cannot honour. Nothing is dropped silently:

* :data:`HONOURED`: translated into an :class:`ssl.SSLContext` and Faust credentials;
* :data:`NOT_SECURITY`: tunables of librdkafka's own producer/consumer/network machinery with no
  effect on who is trusted or how the client authenticates; the projector's aiokafka has its own,
  so they are deliberately not passed;
* anything else is refused, with the reason when it is known (:data:`REFUSED`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import faust
from aiokafka.abc import AbstractTokenProvider  # type: ignore[import-untyped]

from schemas.errors import ConfigError

__all__ = ["HONOURED", "NOT_SECURITY", "REFUSED", "OidcTokenProvider", "broker_credentials",
           "check_keys", "ssl_context"]

#: Keys translated for aiokafka (see :func:`broker_credentials` for how each one is applied).
HONOURED = frozenset({
    "security.protocol",
    # TLS: trust, client certificate, verification
    "ssl.ca.location", "ssl.ca.pem", "ssl.crl.location",
    "ssl.certificate.location", "ssl.certificate.pem",
    "ssl.key.location", "ssl.key.pem", "ssl.key.password",
    "ssl.keystore.location", "ssl.keystore.password",
    "ssl.endpoint.identification.algorithm", "enable.ssl.certificate.verification",
    "ssl.cipher.suites",
    # SASL
    "sasl.mechanism", "sasl.mechanisms", "sasl.username", "sasl.password",
    # SASL/OAUTHBEARER with sasl.oauthbearer.method=oidc (client credentials grant)
    "sasl.oauthbearer.method", "sasl.oauthbearer.client.id", "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.client.credentials.client.id", "sasl.oauthbearer.client.credentials.client.secret",
    "sasl.oauthbearer.token.endpoint.url", "sasl.oauthbearer.scope", "sasl.oauthbearer.extensions",
    "sasl.oauthbearer.grant.type", "sasl.oauthbearer.metadata.authentication.type",
    "https.ca.location", "https.ca.pem",
    # identity, not security, but cheap to keep equal: quotas and broker logs name it
    "client.id",
})

#: Non-security librdkafka tunables the projector deliberately does not pass (its aiokafka client has
#: its own batching, timeouts and fetch sizes): producer batching and delivery, consumer fetching and
#: group timing, sockets, metadata refresh, librdkafka's logging and statistics.
NOT_SECURITY = frozenset({
    # producer
    "linger.ms", "queue.buffering.max.ms", "batch.size", "batch.num.messages", "compression.type",
    "compression.codec", "compression.level", "message.timeout.ms", "delivery.timeout.ms",
    "request.timeout.ms", "retries", "message.send.max.retries", "retry.backoff.ms",
    "retry.backoff.max.ms", "queue.buffering.max.messages", "queue.buffering.max.kbytes",
    "sticky.partitioning.linger.ms", "partitioner", "message.max.bytes", "message.copy.max.bytes",
    # consumer
    "fetch.wait.max.ms", "fetch.min.bytes", "fetch.max.bytes", "max.partition.fetch.bytes",
    "fetch.message.max.bytes", "fetch.error.backoff.ms", "fetch.queue.backoff.ms",
    "queued.min.messages", "queued.max.messages.kbytes", "session.timeout.ms",
    "heartbeat.interval.ms", "max.poll.interval.ms", "coordinator.query.interval.ms",
    "auto.commit.interval.ms", "check.crcs", "client.rack",
    # network and metadata
    "socket.timeout.ms", "socket.keepalive.enable", "socket.nagle.disable",
    "socket.send.buffer.bytes", "socket.receive.buffer.bytes", "socket.connection.setup.timeout.ms",
    "connections.max.idle.ms", "reconnect.backoff.ms", "reconnect.backoff.max.ms",
    "receive.message.max.bytes", "max.in.flight.requests.per.connection", "max.in.flight",
    "metadata.max.age.ms", "topic.metadata.refresh.interval.ms", "topic.metadata.refresh.fast.interval.ms",
    "topic.metadata.propagation.max.ms", "metadata.recovery.strategy",
    "metadata.recovery.rebootstrap.trigger.ms", "broker.address.family", "broker.address.ttl",
    "api.version.request.timeout.ms", "allow.auto.create.topics",
    # librdkafka's logging and statistics
    "debug", "log.connection.close", "log.thread.name", "statistics.interval.ms",
})

_GSSAPI = ("GSSAPI (Kerberos) is not supported by the projector's Kafka client (aiokafka without a "
           "Kerberos setup); use SCRAM, PLAIN or OAUTHBEARER")
_KEYSTORE_PEM = "use PEM files or text (ssl.certificate.*/ssl.key.*) instead"

#: Known security keys the projector cannot honour, with the reason given in the refusal.
REFUSED: dict[str, str] = {
    "ssl.curves.list": "Python's ssl module cannot restrict the TLS groups to a list",
    "ssl.sigalgs.list": "Python's ssl module cannot restrict the TLS signature algorithms",
    "ssl.providers": "OpenSSL providers cannot be loaded through Python's ssl module",
    "ssl.engine.location": "OpenSSL engines cannot be loaded through Python's ssl module",
    "ssl.engine.id": "OpenSSL engines cannot be loaded through Python's ssl module",
    "ssl.ca.certificate.stores": "Windows certificate stores are not read; give ssl.ca.location or "
                                 "ssl.ca.pem",
    "sasl.kerberos.service.name": _GSSAPI,
    "sasl.kerberos.principal": _GSSAPI,
    "sasl.kerberos.kinit.cmd": _GSSAPI,
    "sasl.kerberos.keytab": _GSSAPI,
    "sasl.kerberos.min.time.before.relogin": _GSSAPI,
    "sasl.oauthbearer.config": "only sasl.oauthbearer.method=oidc with client credentials is supported",
    "enable.sasl.oauthbearer.unsecure.jwt": "the unsecured JWT handler is for development only; "
                                            "use sasl.oauthbearer.method=oidc",
    "sasl.oauthbearer.assertion.algorithm": "the JWT bearer grant is not supported; use client credentials",
    "sasl.oauthbearer.assertion.private.key.file": "the JWT bearer grant is not supported",
    "sasl.oauthbearer.assertion.private.key.passphrase": "the JWT bearer grant is not supported",
    "sasl.oauthbearer.assertion.private.key.pem": "the JWT bearer grant is not supported",
    "sasl.oauthbearer.assertion.file": "the JWT bearer grant is not supported",
    "sasl.oauthbearer.assertion.claim.aud": "the JWT bearer grant is not supported",
    "sasl.oauthbearer.assertion.claim.exp.seconds": "the JWT bearer grant is not supported",
    "sasl.oauthbearer.assertion.claim.iss": "the JWT bearer grant is not supported",
    "sasl.oauthbearer.assertion.claim.jti.include": "the JWT bearer grant is not supported",
    "sasl.oauthbearer.assertion.claim.nbf.seconds": "the JWT bearer grant is not supported",
    "sasl.oauthbearer.assertion.claim.sub": "the JWT bearer grant is not supported",
    "sasl.oauthbearer.assertion.jwt.template.file": "the JWT bearer grant is not supported",
}

_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


def env_name(key: str) -> str:
    """The environment variable that sets librdkafka's ``key`` (``Settings.from_env``'s mapping)."""
    return "RUNLOG_KAFKA_" + key.upper().replace(".", "_")


def _refuse(key: str, why: str) -> ConfigError:
    return ConfigError(f"the projector cannot honour {env_name(key)} ({key}): {why}; it refuses to start "
                       f"rather than connect differently from the other Kafka clients")


def check_keys(extra: Mapping[str, str]) -> None:
    """Raise :class:`ConfigError` naming the first key that is neither honoured nor a known
    non-security tunable."""
    for key in sorted(extra):
        if key in HONOURED or key in NOT_SECURITY:
            continue
        raise _refuse(key, REFUSED.get(key, "not a setting the projector knows how to apply (only the "
                                            "security settings its Kafka client supports, and the "
                                            "tunables listed in processors._kafka_security, are accepted)"))


def _flag(extra: Mapping[str, str], key: str, default: bool) -> bool:
    raw = str(extra.get(key, "")).strip().lower()
    if not raw:
        return default
    if raw in ("true", "1"):
        return True
    if raw in ("false", "0"):
        return False
    raise _refuse(key, f"{raw!r} is not true or false")


@contextmanager
def _pem_files(**pems: str | None) -> Iterator[dict[str, str | None]]:
    """PEM text written to private temporary files (Python's ssl loads certificates and keys from
    files only), deleted when the block ends: the context keeps what it loaded."""
    with tempfile.TemporaryDirectory(prefix="runlog-tls-") as tmp:
        out: dict[str, str | None] = {}
        for name, text in pems.items():
            if text is None:
                out[name] = None
                continue
            path = os.path.join(tmp, name + ".pem")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
            out[name] = path
        yield out


def _keystore_pems(location: str, password: str | None) -> tuple[str, str]:
    """A PKCS#12 keystore as (certificate chain PEM, unencrypted key PEM) text."""
    try:
        from cryptography.hazmat.primitives.serialization import (
            Encoding,
            NoEncryption,
            PrivateFormat,
            pkcs12,
        )
    except ImportError:  # pragma: no cover - cryptography comes with confluent-kafka[schemaregistry]
        raise _refuse("ssl.keystore.location", f"reading PKCS#12 needs the cryptography package; "
                                               f"{_KEYSTORE_PEM}") from None
    try:
        with open(location, "rb") as f:
            key, cert, chain = pkcs12.load_key_and_certificates(
                f.read(), password.encode() if password else None)
    except (OSError, ValueError) as err:
        raise _failed("ssl.keystore.location", location, err) from None
    if key is None or cert is None:
        raise ConfigError(f"RUNLOG_KAFKA_SSL_KEYSTORE_LOCATION ({location}) holds no key and certificate")
    certs = b"".join(c.public_bytes(Encoding.PEM) for c in [cert, *chain])
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    return certs.decode(), pem.decode()


def _failed(key: str, value: str, err: Exception) -> ConfigError:
    return ConfigError(f"{env_name(key)} ({key}={value}) failed: {err}")


def ssl_context(extra: Mapping[str, str]) -> ssl.SSLContext:
    """The TLS context librdkafka would build from ``extra``, for Python's ssl.

    * trust: ``ssl.ca.location`` (a file or a directory; ``probe``: the system's CA paths) and
      ``ssl.ca.pem`` (loaded with ``cadata=``), both when both are given; neither: the system CAs;
    * ``ssl.crl.location``: CRLs loaded and checked for the broker's certificate (leaf), as
      librdkafka does;
    * client certificate: ``ssl.certificate.location`` / ``ssl.certificate.pem`` with
      ``ssl.key.location`` / ``ssl.key.pem`` (PEM text goes through a private temporary file,
      deleted once loaded) and ``ssl.key.password``; or a PKCS#12 ``ssl.keystore.location`` with
      ``ssl.keystore.password``;
    * ``ssl.endpoint.identification.algorithm``: ``https`` (default) checks the host name, ``none``
      does not; ``enable.ssl.certificate.verification=false`` verifies nothing (as librdkafka);
    * ``ssl.cipher.suites``: the OpenSSL cipher list (TLS 1.2 and below, as librdkafka).
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ca_loc, ca_pem = extra.get("ssl.ca.location"), extra.get("ssl.ca.pem")
    if ca_loc and ca_loc != "probe":
        try:
            if os.path.isdir(ca_loc):
                ctx.load_verify_locations(capath=ca_loc)
            else:
                ctx.load_verify_locations(cafile=ca_loc)
        except (OSError, ssl.SSLError) as err:
            raise _failed("ssl.ca.location", ca_loc, err) from None
    if ca_pem:
        try:
            ctx.load_verify_locations(cadata=ca_pem)
        except (ssl.SSLError, ValueError) as err:
            raise _failed("ssl.ca.pem", "<PEM text>", err) from None
    if (not ca_loc or ca_loc == "probe") and not ca_pem:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    crl = extra.get("ssl.crl.location")
    if crl:
        try:
            ctx.load_verify_locations(cafile=crl)
        except (OSError, ssl.SSLError) as err:
            raise _failed("ssl.crl.location", crl, err) from None
        ctx.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
    _load_client_certificate(ctx, extra)
    algorithm = str(extra.get("ssl.endpoint.identification.algorithm", "https")).strip().lower()
    if algorithm not in ("https", "none"):
        raise _refuse("ssl.endpoint.identification.algorithm", f"{algorithm!r} is not https or none")
    ctx.check_hostname = algorithm == "https"
    if not _flag(extra, "enable.ssl.certificate.verification", True):
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    ciphers = extra.get("ssl.cipher.suites")
    if ciphers:
        try:
            ctx.set_ciphers(ciphers)
        except ssl.SSLError as err:
            raise _failed("ssl.cipher.suites", ciphers, err) from None
    return ctx


def _load_client_certificate(ctx: ssl.SSLContext, extra: Mapping[str, str]) -> None:
    cert_loc, cert_pem = extra.get("ssl.certificate.location"), extra.get("ssl.certificate.pem")
    key_loc, key_pem = extra.get("ssl.key.location"), extra.get("ssl.key.pem")
    password = extra.get("ssl.key.password") or None
    keystore = extra.get("ssl.keystore.location")
    if keystore:
        if cert_loc or cert_pem or key_loc or key_pem:
            raise ConfigError("RUNLOG_KAFKA_SSL_KEYSTORE_LOCATION and RUNLOG_KAFKA_SSL_CERTIFICATE_*/"
                              "RUNLOG_KAFKA_SSL_KEY_* both give a client certificate: keep one")
        cert_pem, key_pem = _keystore_pems(keystore, extra.get("ssl.keystore.password") or None)
        password = None
    if cert_loc and cert_pem:
        raise ConfigError("RUNLOG_KAFKA_SSL_CERTIFICATE_LOCATION and RUNLOG_KAFKA_SSL_CERTIFICATE_PEM are "
                          "both set: keep one")
    if key_loc and key_pem:
        raise ConfigError("RUNLOG_KAFKA_SSL_KEY_LOCATION and RUNLOG_KAFKA_SSL_KEY_PEM are both set: keep one")
    if not (cert_loc or cert_pem):
        if key_loc or key_pem:
            raise ConfigError("a client key (RUNLOG_KAFKA_SSL_KEY_LOCATION/_PEM) is set without its "
                              "certificate (RUNLOG_KAFKA_SSL_CERTIFICATE_LOCATION/_PEM)")
        return
    inline_key = None if key_loc else key_pem
    with _pem_files(cert=None if cert_loc else cert_pem, key=inline_key) as f:
        certfile = cert_loc or f["cert"]
        keyfile = key_loc or f["key"]
        assert certfile is not None
        try:
            ctx.load_cert_chain(certfile, keyfile, password)
        except (OSError, ssl.SSLError) as err:
            raise ConfigError(f"loading the Kafka client certificate and key failed (RUNLOG_KAFKA_SSL_"
                              f"CERTIFICATE_*, RUNLOG_KAFKA_SSL_KEY_*, RUNLOG_KAFKA_SSL_KEY_PASSWORD): "
                              f"{err}") from None


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


def _oidc_provider(extra: Mapping[str, str]) -> OidcTokenProvider:
    method = str(extra.get("sasl.oauthbearer.method", "default")).strip().lower()
    if method != "oidc":
        raise _refuse("sasl.oauthbearer.method", f"OAUTHBEARER with method {method!r} needs an in-process "
                      "token callback or librdkafka's unsecured development tokens; set "
                      "sasl.oauthbearer.method=oidc with a client id, secret and token endpoint")
    grant = str(extra.get("sasl.oauthbearer.grant.type", "client_credentials")).strip()
    if grant != "client_credentials":
        raise _refuse("sasl.oauthbearer.grant.type", f"{grant!r} is not supported; use client_credentials")
    imds = str(extra.get("sasl.oauthbearer.metadata.authentication.type", "none")).strip().lower()
    if imds != "none":
        raise _refuse("sasl.oauthbearer.metadata.authentication.type", f"{imds!r} is not supported")
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
            raise _refuse("sasl.oauthbearer.extensions", f"{item!r} is not key=value")
        extensions[name.strip()] = value.strip()
    context = None
    if url.lower().startswith("https:"):
        context = ssl.create_default_context(cafile=extra.get("https.ca.location") or None,
                                             cadata=extra.get("https.ca.pem") or None)
    return OidcTokenProvider(url, client_id, secret, scope=extra.get("sasl.oauthbearer.scope") or None,
                             extensions=extensions, context=context)


def broker_credentials(extra: Mapping[str, str]) -> Any:
    """Faust ``broker_credentials`` for the librdkafka settings ``extra`` (None for PLAINTEXT).

    ``security.protocol`` SSL gives :class:`faust.SSLCredentials` with :func:`ssl_context`;
    SASL_PLAINTEXT / SASL_SSL give :class:`faust.SASLCredentials` (PLAIN, SCRAM-SHA-256,
    SCRAM-SHA-512: ``sasl.username`` / ``sasl.password``) or :class:`faust.OAuthCredentials`
    (OAUTHBEARER through :class:`OidcTokenProvider`), with the TLS context for SASL_SSL.
    Raises :class:`ConfigError` naming the setting for anything it cannot honour.
    """
    check_keys(extra)
    proto = str(extra.get("security.protocol", "PLAINTEXT")).strip().upper()
    if proto not in _PROTOCOLS:
        raise _refuse("security.protocol", f"{proto!r} is not one of {', '.join(_PROTOCOLS)}")
    ctx = ssl_context(extra) if proto in ("SSL", "SASL_SSL") else None
    if proto == "PLAINTEXT":
        return None
    if proto == "SSL":
        return faust.SSLCredentials(ctx)
    mechanism = str(extra.get("sasl.mechanism") or extra.get("sasl.mechanisms") or "").strip().upper()
    if not mechanism:
        raise _refuse("sasl.mechanism", f"it is unset, so librdkafka uses GSSAPI: {_GSSAPI}")
    if mechanism not in _MECHANISMS:
        raise _refuse("sasl.mechanism", _GSSAPI if mechanism == "GSSAPI" else
                      f"{mechanism!r} is not one of {', '.join(_MECHANISMS)}")
    if mechanism == "OAUTHBEARER":
        return faust.OAuthCredentials(oauth_cb=_oidc_provider(extra), ssl_context=ctx)
    return faust.SASLCredentials(username=extra.get("sasl.username"), password=extra.get("sasl.password"),
                                 ssl_context=ctx, mechanism=mechanism)
