"""A member's wait at start (:mod:`runlog.processors._startup`) on a fake clock: which errors it waits
out, for how long, what it says on each try, and that it gives up with the service's own error. The
members on the real services: ``tests/integration/processors/test_startup_wait.py``."""

from __future__ import annotations

import io
import threading

import pytest
import redis

from runlog.processors._startup import BACKOFF_S, Stopped, transient, wait_for_services
from runlog.processors.admin import RedisModeMismatch, ServiceUnavailable
from runlog.schemas.errors import ConfigError, LogUnavailable


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def _down(what: str = "Redis") -> ServiceUnavailable:
    try:
        raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")
    except redis.ConnectionError as err:
        try:
            raise ServiceUnavailable(f"{what} did not answer: {err}") from err
        except ServiceUnavailable as wrapped:
            return wrapped


def _failing(times: int, error: Exception, calls: list[str], name: str) -> object:
    def check() -> None:
        calls.append(name)
        if calls.count(name) <= times:
            raise error
    return check


def test_a_service_that_answers_after_some_tries_is_waited_for_with_a_line_per_try() -> None:
    clock, out, calls = Clock(), io.StringIO(), []
    tries = wait_for_services([_failing(3, _down(), calls, "redis"), _failing(2, LogUnavailable("no broker"),
                                                                              calls, "kafka")],
                              who="runlog project", wait_ms=60_000, err=out, sleep=clock.sleep, clock=clock)
    # the first check is not made again once it passed; the backoff goes on counting across checks
    assert calls == ["redis"] * 4 + ["kafka"] * 3
    assert tries == 7
    assert clock.slept == [*BACKOFF_S[:5]]
    lines = out.getvalue().splitlines()
    assert len(lines) == 5
    assert lines[0].startswith("runlog project: waiting for the services: Redis did not answer: Error 111")
    assert "trying again in 0.5 s, 60 s left of RUNLOG_STARTUP_WAIT_MS" in lines[0]
    assert "no broker" in lines[3] and "trying again in 4.0 s" in lines[3]


def test_the_wait_gives_up_with_the_services_own_error_when_the_time_is_over() -> None:
    clock, out, calls = Clock(), io.StringIO(), []
    error = _down()
    with pytest.raises(ServiceUnavailable) as caught:
        wait_for_services([_failing(10_000, error, calls, "redis")], who="resumer", wait_ms=12_000,
                          err=out, sleep=clock.sleep, clock=clock)
    assert caught.value is error
    assert sum(clock.slept) == pytest.approx(12.0)  # the last pause is cut to the time left
    assert clock.slept[:4] == [0.5, 1.0, 2.0, 4.0] and max(clock.slept) <= 5.0
    assert len(calls) == len(clock.slept) + 1  # a last try at the deadline


def test_a_wait_of_zero_raises_at_the_first_failure_without_a_line() -> None:
    clock, out, calls = Clock(), io.StringIO(), []
    with pytest.raises(ServiceUnavailable):
        wait_for_services([_failing(1, _down(), calls, "redis")], who="worker", wait_ms=0, err=out,
                          sleep=clock.sleep, clock=clock)
    assert calls == ["redis"] and clock.slept == [] and out.getvalue() == ""


@pytest.mark.parametrize("error", [
    ConfigError("the projector's topics do not exist"),
    RedisModeMismatch("REDIS_URL names a Redis Cluster node"),
    ValueError("a bug"),
], ids=["missing-topics", "cluster-url", "other"])
def test_what_a_service_answered_is_raised_at_once(error: Exception) -> None:
    clock, out, calls = Clock(), io.StringIO(), []
    with pytest.raises(type(error)):
        wait_for_services([_failing(1, error, calls, "check")], who="worker", wait_ms=60_000, err=out,
                          sleep=clock.sleep, clock=clock)
    assert calls == ["check"] and clock.slept == []


def _wrapped(cause: Exception) -> ServiceUnavailable:
    try:
        raise cause
    except Exception as err:  # noqa: BLE001
        try:
            raise ServiceUnavailable(f"Redis did not answer: {err}") from err
        except ServiceUnavailable as wrapped:
            return wrapped


def test_refused_credentials_and_untrusted_certificates_are_not_waited_for() -> None:
    assert transient(_down())
    assert transient(LogUnavailable("listing the topics failed: all brokers down"))
    assert not transient(_wrapped(redis.AuthenticationError("invalid username-password pair")))
    assert not transient(_wrapped(redis.ResponseError("WRONGPASS invalid username-password pair")))
    assert not transient(_wrapped(redis.ConnectionError(
        "Error 1 connecting to 127.0.0.1:6380. [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")))
    assert not transient(redis.ConnectionError("not wrapped: the checks' own errors are what is waited out"))


def test_a_stop_during_the_wait_ends_it_with_a_line_and_stopped() -> None:
    clock, out, calls = Clock(), io.StringIO(), []
    stop = threading.Event()

    def sleep(s: float) -> None:
        clock.sleep(s)
        if len(clock.slept) == 2:
            stop.set()  # SIGTERM's handler, during the second pause

    with pytest.raises(Stopped):
        wait_for_services([_failing(10, _down(), calls, "redis")], who="worker", wait_ms=60_000, err=out,
                          sleep=sleep, clock=clock, stop=stop)
    assert calls == ["redis"] * 2  # not tried again after the stop
    assert out.getvalue().splitlines()[-1] == \
        "worker: SIGTERM while waiting for the services: stopping (nothing was started)"


def test_a_stop_during_a_check_that_passes_still_stops() -> None:
    stop = threading.Event()
    out = io.StringIO()

    def check() -> None:
        stop.set()

    with pytest.raises(Stopped):
        wait_for_services([check], who="resumer", wait_ms=0, err=out, stop=stop)
    assert "SIGTERM" in out.getvalue()


def test_sigterm_sets_the_stop_and_the_handler_before_is_put_back() -> None:
    import os
    import signal

    before = signal.getsignal(signal.SIGTERM)
    stop = threading.Event()

    def check() -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # delivered to this (main) thread: the wait's handler
        raise _down()

    with pytest.raises(Stopped):
        wait_for_services([check], who="resumer", wait_ms=60_000, err=io.StringIO(), stop=stop,
                          sleep=lambda s: None)
    assert stop.is_set()
    assert signal.getsignal(signal.SIGTERM) is before
