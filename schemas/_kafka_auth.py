"""A broker that refuses the credentials, as one typed error:
:class:`~runlog.schemas.errors.AuthenticationFailed`.

librdkafka reports an authentication failure (a wrong SASL password, an unsupported mechanism, a
failed TLS handshake) to the client's error callback, and otherwise only logs it and retries for
ever: a consumer polls nothing, a metadata request times out as "Broker transport failure".
:class:`AuthWatch` is the ``error_cb`` of every client built from
:meth:`~runlog.schemas._client_config.ClientConfig.kafka_common`: it raises ``AuthenticationFailed``, which
confluent-kafka re-raises from the ``poll``/``flush``/``consume`` call that served the callback.

Blocking metadata calls (``list_topics``, ``get_watermark_offsets``, ``committed``) and the
futures of admin requests serve no callback, so they would wait out their whole timeout and then
fail as a transport error or a timeout; :func:`served` and :func:`awaited` ask or wait in short steps
and serve the client's callbacks in between, so the first authentication failure ends them within
a step.

Once a failure has been reported, librdkafka's repeated ``FAIL`` lines about it are dropped (the
``librdkafka`` logger's filter asks :func:`auth_failure_line`); a program that reports every
failure itself (the ``runlog`` CLI) calls :func:`quiet_auth_lines` to drop the first one too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException

from runlog.schemas.errors import AuthenticationFailed

__all__ = ["AUTHENTICATION_ERRORS", "AUTHORIZATION_ERRORS", "UNREACHABLE_ERRORS", "AuthWatch",
           "auth_failure_line", "awaited", "quiet_auth_lines", "refused", "served"]

T = TypeVar("T")

AUTHENTICATION_ERRORS = frozenset({
    KafkaError._AUTHENTICATION,  # librdkafka's code for a failed SASL exchange
    KafkaError.SASL_AUTHENTICATION_FAILED,
    KafkaError.UNSUPPORTED_SASL_MECHANISM,
    KafkaError.ILLEGAL_SASL_STATE,
    KafkaError._SSL,  # the TLS handshake failed (certificate not trusted, no client certificate, ...)
})
AUTHORIZATION_ERRORS = frozenset({
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
})

#: What a request gets while no broker connection is up (an authentication failure among the causes):
#: :func:`served` asks again on these.
UNREACHABLE_ERRORS = frozenset({
    KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE,
    KafkaError.REQUEST_TIMED_OUT,
})

#: How long one step of :func:`served` waits before serving the client's callbacks.
STEP_S = 0.5

_state = {"reported": False, "quiet": False}


def quiet_auth_lines() -> None:
    """Drop every librdkafka log line about a failed authentication, the first one included: the
    caller reports :class:`AuthenticationFailed` itself (the ``runlog`` CLI does, once)."""
    _state["quiet"] = True


def auth_failure_line(text: str) -> bool:
    """Whether a librdkafka log line reports a failed authentication that is (or, under
    :func:`quiet_auth_lines`, will be) reported as :class:`AuthenticationFailed`: the filter of the
    ``librdkafka`` logger drops it then."""
    if not (_state["reported"] or _state["quiet"]):
        return False
    return "SASL authentication error" in text or "SSL handshake failed" in text


def _strip_broker(text: str) -> str:
    """librdkafka's reason without its leading ``sasl_ssl://host:port/id: `` (the broker is named
    by the message already)."""
    head, sep, rest = text.partition(": ")
    return rest if sep and "://" in head else text


def refused(conf: Mapping[str, Any], detail: str, kind: str = "authentication") -> AuthenticationFailed:
    """:class:`AuthenticationFailed` for a client with librdkafka settings ``conf``: its broker,
    protocol, SASL mechanism and user; any password or secret of ``conf`` found in ``detail`` is
    masked (no client is known to put one there)."""
    protocol = str(conf.get("security.protocol") or "PLAINTEXT").upper()
    sasl = protocol.startswith("SASL")
    for k, v in conf.items():
        if isinstance(v, str) and v and ("password" in k or "secret" in k):
            detail = detail.replace(v, "***")
    return AuthenticationFailed(
        str(conf.get("bootstrap.servers", "")), detail, protocol=protocol,
        mechanism=str(conf.get("sasl.mechanism") or conf.get("sasl.mechanisms") or "") if sasl else "",
        user=str(conf.get("sasl.username") or "") if sasl else "", kind=kind)


class AuthWatch:
    """The ``error_cb`` of a librdkafka client with settings ``conf``: an authentication (or
    authorization) error raises :class:`AuthenticationFailed` (:func:`refused`); every other error
    is left to the client, as without a callback."""

    def __init__(self, conf: Mapping[str, Any]) -> None:
        self._conf = {k: v for k, v in conf.items() if isinstance(v, str)}

    def error(self, err: KafkaError) -> AuthenticationFailed | None:
        """The :class:`AuthenticationFailed` that ``err`` is, or None."""
        code = err.code()
        if code not in AUTHENTICATION_ERRORS and code not in AUTHORIZATION_ERRORS:
            return None
        return refused(self._conf, _strip_broker(err.str()),
                       "authorization" if code in AUTHORIZATION_ERRORS else "authentication")

    def __call__(self, err: KafkaError) -> None:
        failure = self.error(err)
        if failure is None:
            return
        # the raised error is not kept here: its traceback holds the frames that hold the client,
        # whose callback this is, a cycle the garbage collector cannot break (the client's C object
        # does not traverse its callbacks), so the client was destroyed only at interpreter exit,
        # where librdkafka's teardown beside OpenSSL's can crash the process (SIGSEGV)
        _state["reported"] = True
        raise failure


def _serve(client: Any) -> None:
    """Serve ``client``'s queued callbacks (its error callback may raise :class:`AuthenticationFailed`).
    A consumer with partitions assigned is left alone: its poll would take a message; so is an
    object with no ``poll``."""
    poll = getattr(client, "poll", None)
    if poll is None:
        return
    if hasattr(client, "assignment"):
        try:
            if client.assignment():
                return
        except (KafkaException, RuntimeError):
            return
    poll(0)


def served(client: Any, call: Callable[[float], T], timeout: float) -> T:
    """``call(t)`` (a blocking request of ``client`` with timeout ``t``), asked again in steps of
    :data:`STEP_S` until ``timeout`` while it fails, with ``client``'s callbacks served after each
    failed step: an authentication failure raises :class:`AuthenticationFailed` within a step instead
    of the request timing out. Only :data:`UNREACHABLE_ERRORS` are asked again; the last step's
    ``KafkaException`` is raised at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            return call(max(min(STEP_S, left), 0.05))
        except KafkaException as err:
            _serve(client)
            kerr = err.args[0] if err.args else None
            code = kerr.code() if isinstance(kerr, KafkaError) else None
            if code not in UNREACHABLE_ERRORS or deadline - time.monotonic() <= 0:
                raise


def awaited(client: Any, future: Future[T], timeout: float) -> T:
    """``future.result(timeout)`` for a future of an admin ``client``'s request, waited for in steps
    of :data:`STEP_S` with the client's callbacks served in between (:func:`served`): an
    authentication failure raises :class:`AuthenticationFailed` instead of the wait timing out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return future.result(max(min(STEP_S, deadline - time.monotonic()), 0.0))
        except TimeoutError:
            _serve(client)
            if deadline - time.monotonic() <= 0:
                raise
