"""The projector's Kafka credentials, tried once before Faust starts.

Faust's client (aiokafka) logs a refused SASL exchange or TLS handshake as "Unable connect", then
fails its start with ``KafkaConnectionError: Unable to bootstrap`` and a traceback: the reason is
only in a log line. :func:`check_credentials` opens one connection to a bootstrap server with the
very credentials Faust gets (:func:`~runlog.processors.projector._security.broker_credentials`) and turns
a refusal into :class:`~runlog.schemas.errors.AuthenticationFailed`, which ``runlog project`` reports in
one line (exit 4). A server that cannot be reached is left to Faust, as before.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

from runlog.processors.projector._security import broker_credentials
from runlog.schemas.internal import refused
from runlog.schemas.settings import Settings

__all__ = ["check_credentials"]


def _servers(bootstrap: str) -> list[tuple[str, int]]:
    out = []
    for item in bootstrap.split(","):
        host, _, port = item.strip().rpartition(":")
        if host and port.isdigit():
            out.append((host.strip("[]"), int(port)))
    return out


async def _connect(host: str, port: int, auth: dict[str, Any], timeout_s: float) -> None:
    from aiokafka.conn import create_conn  # type: ignore[import-untyped]

    conn = await asyncio.wait_for(
        create_conn(host, port, request_timeout_ms=int(timeout_s * 1000), **auth), timeout_s)
    conn.close()


def check_credentials(settings: Settings, timeout_s: float = 15.0) -> None:
    """Connect to the first bootstrap server that answers with the projector's credentials.

    Raises:
        AuthenticationFailed: the broker refused them (SASL) or the TLS handshake failed.
    """
    creds = broker_credentials(settings.kafka_extra)
    if creds is None:
        return
    from aiokafka import errors as ak  # type: ignore[import-untyped]
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    refusals = (ak.SaslAuthenticationFailed, ak.AuthenticationFailedError,
                ak.AuthenticationMethodNotSupported, ak.UnsupportedSaslMechanismError,
                ak.IllegalSaslStateError, ssl.SSLError)
    auth = dict(credentials_to_aiokafka_auth(creds))
    conf = {**settings.kafka_extra, "bootstrap.servers": settings.kafka_bootstrap_servers}
    for host, port in _servers(settings.kafka_bootstrap_servers):
        loop = asyncio.new_event_loop()  # not the current loop: Faust makes and runs its own after this
        try:
            loop.run_until_complete(_connect(host, port, auth, timeout_s))
            return
        except refusals as err:
            raise refused(conf, str(err) or type(err).__name__) from err
        except (TimeoutError, OSError, ak.KafkaError):
            continue  # not reachable: the next server, then Faust's own retries and report
        finally:
            loop.close()
