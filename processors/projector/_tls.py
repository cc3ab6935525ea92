"""The TLS side of the projector's Kafka client: the :class:`ssl.SSLContext` librdkafka would build
from the ``ssl.*`` settings (trust, CRLs, client certificate from files, PEM text or a PKCS#12
keystore, host name checking, cipher suites), each failure naming its setting."""

from __future__ import annotations

import os
import ssl
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from runlog.processors.projector._keys import KEYSTORE_PEM, failed, flag, refuse
from runlog.schemas.errors import ConfigError

__all__ = ["ssl_context"]

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
        raise refuse("ssl.keystore.location", f"reading PKCS#12 needs the cryptography package; "
                                               f"{KEYSTORE_PEM}") from None
    try:
        with open(location, "rb") as f:
            key, cert, chain = pkcs12.load_key_and_certificates(
                f.read(), password.encode() if password else None)
    except (OSError, ValueError) as err:
        raise failed("ssl.keystore.location", location, err) from None
    if key is None or cert is None:
        raise ConfigError(f"RUNLOG_KAFKA_SSL_KEYSTORE_LOCATION ({location}) holds no key and certificate")
    certs = b"".join(c.public_bytes(Encoding.PEM) for c in [cert, *chain])
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    return certs.decode(), pem.decode()


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
            raise failed("ssl.ca.location", ca_loc, err) from None
    if ca_pem:
        try:
            ctx.load_verify_locations(cadata=ca_pem)
        except (ssl.SSLError, ValueError) as err:
            raise failed("ssl.ca.pem", "<PEM text>", err) from None
    if (not ca_loc or ca_loc == "probe") and not ca_pem:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    crl = extra.get("ssl.crl.location")
    if crl:
        try:
            ctx.load_verify_locations(cafile=crl)
        except (OSError, ssl.SSLError) as err:
            raise failed("ssl.crl.location", crl, err) from None
        ctx.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
    _load_client_certificate(ctx, extra)
    algorithm = str(extra.get("ssl.endpoint.identification.algorithm", "https")).strip().lower()
    if algorithm not in ("https", "none"):
        raise refuse("ssl.endpoint.identification.algorithm", f"{algorithm!r} is not https or none")
    ctx.check_hostname = algorithm == "https"
    if not flag(extra, "enable.ssl.certificate.verification", True):
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    ciphers = extra.get("ssl.cipher.suites")
    if ciphers:
        try:
            ctx.set_ciphers(ciphers)
        except ssl.SSLError as err:
            raise failed("ssl.cipher.suites", ciphers, err) from None
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
