"""librdkafka security settings (``RUNLOG_KAFKA_*``) translated for the projector's Kafka client.

The projector runs on Faust, whose Kafka client is aiokafka, not librdkafka: every setting the
other clients receive verbatim must be translated, or the projector would connect with weaker
security than them (or fail, as an inline ``ssl.ca.pem`` did). :func:`broker_credentials` does it,
key by key, and refuses (:class:`~runlog.schemas.errors.ConfigError` naming the setting) every key it
cannot honour. Nothing is dropped silently:

* :data:`HONOURED`: translated into an :class:`ssl.SSLContext` and Faust credentials;
* :data:`NOT_SECURITY`: tunables of librdkafka's own producer/consumer/network machinery with no
  effect on who is trusted or how the client authenticates; the projector's aiokafka has its own,
  so they are deliberately not passed;
* anything else is refused, with the reason when it is known (:data:`REFUSED`).

The lists are in :mod:`runlog.processors.projector._keys`, the TLS context in
:mod:`runlog.processors.projector._tls`,
the OAUTHBEARER token provider in :mod:`runlog.processors.projector._oidc`; their public names stay
importable from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import faust

from runlog.processors.projector._keys import GSSAPI, HONOURED, NOT_SECURITY, REFUSED, check_keys, refuse
from runlog.processors.projector._oidc import OidcTokenProvider, oidc_provider
from runlog.processors.projector._tls import ssl_context

__all__ = ["HONOURED", "NOT_SECURITY", "REFUSED", "OidcTokenProvider", "broker_credentials",
           "check_keys", "ssl_context"]

_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


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
        raise refuse("security.protocol", f"{proto!r} is not one of {', '.join(_PROTOCOLS)}")
    ctx = ssl_context(extra) if proto in ("SSL", "SASL_SSL") else None
    if proto == "PLAINTEXT":
        return None
    if proto == "SSL":
        return faust.SSLCredentials(ctx)
    mechanism = str(extra.get("sasl.mechanism") or extra.get("sasl.mechanisms") or "").strip().upper()
    if not mechanism:
        raise refuse("sasl.mechanism", f"it is unset, so librdkafka uses GSSAPI: {GSSAPI}")
    if mechanism not in _MECHANISMS:
        raise refuse("sasl.mechanism", GSSAPI if mechanism == "GSSAPI" else
                      f"{mechanism!r} is not one of {', '.join(_MECHANISMS)}")
    if mechanism == "OAUTHBEARER":
        return faust.OAuthCredentials(oauth_cb=oidc_provider(extra), ssl_context=ctx)
    return faust.SASLCredentials(username=extra.get("sasl.username"), password=extra.get("sasl.password"),
                                 ssl_context=ctx, mechanism=mechanism)
