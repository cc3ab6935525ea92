"""A member waits at start for the services it needs (``RUNLOG_STARTUP_WAIT_MS``).

Services started together (compose, a Kubernetes rollout, a host booting) come up in any order, and
one that restarts (Redis killed and started again) is away for seconds. ``runlog project``,
``runlog resumer`` and ``runlog worker`` check what they need before joining their group;
:func:`wait_for_services` tries those checks again while a service does not answer, with one line
on stderr for each try, and gives up after the wait (the last error is raised, which the CLI reports
in one line, exit 3). Kafka down is otherwise waited out by the clients themselves; a refused password,
an untrusted certificate, a ``redis://`` URL to a cluster node or a missing topic are not waits: they
are raised at once. SIGTERM while a member waits (a rollout stopping what never started) ends the wait
with :class:`Stopped`: nothing is in hand yet, and the member exits 0 as it does when stopped serving.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import NoReturn, TextIO

from runlog.processors.admin import RedisModeMismatch, ServiceUnavailable, check_redis
from runlog.schemas.errors import LogUnavailable
from runlog.schemas.internal import causes
from runlog.schemas.settings import Settings

__all__ = ["BACKOFF_S", "Stopped", "transient", "wait_for_redis", "wait_for_services"]

BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 5.0)
"""Seconds between tries: each try waits the next of these, then the last again."""

_REFUSALS = ("CERTIFICATE_VERIFY_FAILED", "WRONGPASS", "NOAUTH")
"""Words of an error (or one of its causes) saying a service answered and refused."""


class Stopped(Exception):
    """SIGTERM arrived while a member waited for its services: it has joined nothing and holds
    nothing, so its command exits 0 (the line saying so is printed by :func:`wait_for_services`)."""


@contextlib.contextmanager
def _sigterm_sets(flag: threading.Event) -> Iterator[None]:
    """SIGTERM sets ``flag`` while inside (the previous handler put back after); outside the main
    thread, where no handler can be installed, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda _sig, _frame: flag.set())
    try:
        yield
    finally:  # None: a handler not installed from Python, which cannot be put back from it
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def transient(err: BaseException) -> bool:
    """Whether ``err`` says a service did not answer (a wait may see it answer), as opposed to one that
    answered no: a refused password or ACL, a certificate not trusted, a URL of the wrong mode."""
    import redis.exceptions

    if isinstance(err, RedisModeMismatch) or not isinstance(err, ServiceUnavailable | LogUnavailable):
        return False
    refused = redis.exceptions.AuthenticationError | redis.exceptions.AuthorizationError
    return not any(isinstance(e, refused) or any(word in str(e) for word in _REFUSALS) for e in causes(err))


def wait_for_services(checks: Sequence[Callable[[], object]], *, who: str, wait_ms: int,
                      err: TextIO | None = None, sleep: Callable[[float], object] | None = None,
                      clock: Callable[[], float] = time.monotonic,
                      stop: threading.Event | None = None) -> int:
    """Run ``checks`` in order until each has passed once; the number of tries it took.

    A check that raises a :func:`transient` error is tried again (the ones before it are not run
    again) after the next of :data:`BACKOFF_S`, with a line on ``err`` (stderr) naming ``who``, the
    error and the time left, until ``wait_ms`` have passed since the first try; then that error is
    raised. Any other error is raised at once, as is every error when ``wait_ms`` is 0.

    SIGTERM (or ``stop`` set) during the wait ends it: a line, then :class:`Stopped` (the member exits
    0). ``sleep`` (default: a wait on ``stop``, which SIGTERM cuts short) and ``clock`` are for tests.
    """
    import sys

    out = err if err is not None else sys.stderr
    flag = stop if stop is not None else threading.Event()
    pause_for = sleep if sleep is not None else flag.wait
    deadline = clock() + wait_ms / 1000
    tries = failures = 0
    with _sigterm_sets(flag):
        for check in checks:
            while True:
                if flag.is_set():
                    _stopped(who, out)
                tries += 1
                try:
                    check()
                    break
                except Exception as error:
                    if not transient(error):
                        raise
                    left = deadline - clock()
                    if flag.is_set():
                        _stopped(who, out)
                    if left <= 0:
                        raise
                    pause = min(BACKOFF_S[min(failures, len(BACKOFF_S) - 1)], left)
                    failures += 1
                    print(f"{who}: waiting for the services: {error} (trying again in {pause:.1f} s, "
                          f"{left:.0f} s left of RUNLOG_STARTUP_WAIT_MS)", file=out, flush=True)
                    pause_for(pause)
        if flag.is_set():  # SIGTERM during the last check, which passed: still a request to stop
            _stopped(who, out)
    return tries


def _stopped(who: str, out: TextIO) -> NoReturn:
    print(f"{who}: SIGTERM while waiting for the services: stopping (nothing was started)", file=out,
          flush=True)
    raise Stopped(who)


def wait_for_redis(settings: Settings, who: str) -> int:
    """:func:`wait_for_services` with the one check a resumer or a worker makes before it joins its
    groups: Redis answers (:func:`~runlog.processors.admin.check_redis`, which also refuses a URL of
    the wrong mode). Kafka not answering is waited out by its consumers."""
    return wait_for_services([lambda: check_redis(settings)], who=who, wait_ms=settings.startup_wait_ms)
