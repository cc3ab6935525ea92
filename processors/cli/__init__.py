"""The ``runlog`` command line: subcommands over Runlog's components.

Exit codes: 0 success, 1 the command ran and found a problem (a failed check,
a difference, a blocked run), 2 bad usage or configuration, 3 a service could
not be reached, 4 the Kafka broker refused the credentials.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import importlib
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Protocol

from runlog.processors.cli.codes import EXIT_AUTH, EXIT_FOUND, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE
from runlog.schemas.errors import AuthenticationFailed, ConfigError, LogUnavailable, RunlogError
from runlog.schemas.internal import causes, quiet_auth_lines, quiet_unreachable_lines

__all__ = ["EXIT_AUTH", "EXIT_FOUND", "EXIT_OK", "EXIT_UNAVAILABLE", "EXIT_USAGE", "main"]

# Each module exposes ``register(subparsers)`` adding its subcommands; a subcommand
# sets ``func`` (args -> exit code) through ``set_defaults``.
_COMMAND_MODULES: tuple[str, ...] = (
    "runlog.processors.cli.admin",
    "runlog.processors.cli.runs",
    "runlog.processors.cli.versions",
    "runlog.processors.cli.project",
    "runlog.processors.cli.audit",
    "runlog.processors.cli.schemas",
    "runlog.processors.cli.bench",
    "runlog.processors.console._cmd",
    "runlog.processors.cli.signal",
    "runlog.processors.cli.operate",
    "runlog.processors.cli.upgrade",
    "runlog.processors.cli.replay",
    "runlog.processors.cli.budget",
    "runlog.processors.cli.tail",
    "runlog.processors.cli.fleet",
    "runlog.processors.cli.privacy",
    "runlog.processors.cli.schedule",
    "runlog.processors.cli.chaos",
)


class _Registers(Protocol):
    def register(self, sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None: ...


def settings_hint() -> str:
    """Where the command looked: the bootstrap servers it was given (never a credential)."""
    import os

    from runlog.schemas.settings import Settings

    return os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or Settings.kafka_bootstrap_servers


def _name_the_defaults() -> None:
    """Without KAFKA_BOOTSTRAP_SERVERS or REDIS_URL a command uses the ports ``deploy/local/up``
    starts: on a shared machine those may be another checkout's services, so it says so first."""
    import os

    from runlog.schemas.settings import Settings

    unset = [(name, value) for name, value in (("KAFKA_BOOTSTRAP_SERVERS", Settings.kafka_bootstrap_servers),
                                               ("REDIS_URL", Settings.redis_url))
             if not os.environ.get(name)]
    if unset:
        print(f"runlog: {' and '.join(n for n, _ in unset)} not set: using "
              f"{' and '.join(v for _, v in unset)} (the ports deploy/local/up starts; set "
              f"{'them' if len(unset) > 1 else 'it'} to use other services)", file=sys.stderr)


def _redis_unreachable(err: BaseException) -> bool:
    """Whether ``err`` was caused, at any depth, by a Redis connection that failed or timed out."""
    import redis.exceptions

    return any(isinstance(e, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError)
               for e in causes(err))


def _redis_cluster_moved(err: BaseException) -> bool:
    """Whether ``err`` was caused, at any depth, by a Redis server answering ``MOVED``: a standalone
    client (a ``redis://`` URL) talking to a Redis Cluster node (or by the store finding that out
    on a missing namespace marker)."""
    import redis.exceptions

    from runlog.projections.internal import StandaloneClientOnClusterNode

    return any(isinstance(e, redis.exceptions.MovedError | StandaloneClientOnClusterNode)
               for e in causes(err))


def _cluster_url_line() -> int:
    print(f"runlog: configuration error: {_redis_hint()} names a Redis Cluster node (it answered MOVED, or "
          "INFO cluster said cluster_enabled:1), "
          "but a redis:// URL makes a standalone client: use "
          "REDIS_URL=redis+cluster://host:port[,host:port...] (rediss+cluster:// for TLS)", file=sys.stderr)
    return EXIT_USAGE


def _untrusted(err: BaseException) -> str:
    """What to set when the TLS handshake with Redis failed on the server's certificate (no CA given)."""
    if any("CERTIFICATE_VERIFY_FAILED" in str(e) for e in causes(err)):
        return (": its TLS certificate is not trusted (set RUNLOG_REDIS_SSL_CA_CERTS or "
                "RUNLOG_REDIS_SSL_CA_PEM to the CA that signed it)")
    return ""


def _redis_unreachable_line(err: BaseException) -> int:
    print(f"runlog: Redis cannot be reached ({_redis_hint()}){_untrusted(err)}: {err}", file=sys.stderr)
    return EXIT_UNAVAILABLE


def _redis_hint() -> str:
    """The Redis the command used, as host:port/db (never its password)."""
    import os
    from urllib.parse import urlsplit

    url = os.environ.get("REDIS_URL")
    if not url:
        return "REDIS_URL is not set"
    parts = urlsplit(url)
    return f"REDIS_URL={parts.scheme}://{parts.hostname}:{parts.port}{parts.path}"


def _version() -> str:

    try:
        return version("runlog")
    except PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="runlog",
        description=(
            "Runlog records agent runs as an append-only Avro log on Kafka, projects "
            "checkpoints and an effects ledger into Redis, and resumes runs from them."
        ),
        epilog="Configuration comes from the environment; see docs/reference/configuration.md.",
    )
    parser.add_argument("--version", action="version", version=f"runlog {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _COMMAND_MODULES:
        module: _Registers = importlib.import_module(name)
        module.register(sub)
    return parser


def dump_on_fatal_signal() -> None:
    """Have a crash of the interpreter (a segmentation fault in a C extension: librdkafka, hiredis,
    fastavro) print every thread's Python stack to stderr, so a member that dies that way leaves in
    its log where it was (a projector of a chaos run exited with signal 11 and an empty log). Left
    as it is where already on (``python -X faulthandler``, pytest) or when stderr is no file."""
    if faulthandler.is_enabled():
        return
    with contextlib.suppress(AttributeError, ValueError, OSError, RuntimeError):  # no stderr file
        faulthandler.enable()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``runlog`` console script."""
    dump_on_fatal_signal()
    try:
        return _main(argv)
    except BrokenPipeError:
        # `runlog runs | head`: the reader has what it wanted. Nothing more can be written to the
        # closed pipe, and Python's own flush at exit would fail on it too: point stdout elsewhere.
        _detach_stdout()
        return EXIT_OK


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # What a command runs is imported once it is known to run: `runlog --help` and a refused
    # argument load no Kafka, Redis or tracing client (each command module imports its own lazily).
    from runlog.processors._tracing import command_span
    from runlog.producers.crash import arm_from_env

    arm_from_env()  # fault tests only: RUNLOG_CRASH_AT names a point where the process kills itself
    func: Callable[[argparse.Namespace], int] = args.func
    quiet_auth_lines()  # an authentication failure is reported here, once, not in librdkafka's lines too
    quiet_unreachable_lines()  # so is a broker that cannot be reached (LogUnavailable, exit 3)
    if not getattr(args, "private_services", False):  # runlog chaos starts its own
        _name_the_defaults()
    try:
        with command_span(args):  # an operator command is a span; what it appends carries its context
            return func(args)
    except KeyboardInterrupt:
        print("runlog: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        raise  # main's: the reader went away
    except Exception as err:  # noqa: BLE001 -- the CLI's last word: one line, never a traceback
        try:
            return _one_line(err)
        finally:
            _let_go(err)


def _one_line(err: Exception) -> int:
    """Print the one line that says what ``err`` means to a person; its exit code."""
    if isinstance(err, AuthenticationFailed):
        print(f"runlog: {err}", file=sys.stderr)
        return EXIT_AUTH
    if isinstance(err, ConfigError):
        print(f"runlog: configuration error: {err}", file=sys.stderr)
        return EXIT_USAGE
    if isinstance(err, LogUnavailable):
        print(f"runlog: the log cannot be read from Kafka at {settings_hint()}: {err}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if isinstance(err, RunlogError):
        if _redis_cluster_moved(err):
            return _cluster_url_line()
        if _redis_unreachable(err):
            return _redis_unreachable_line(err)
        if type(err).__name__ == "ServiceUnavailable":  # runlog.processors.admin's: Kafka or Redis
            print(f"runlog: {err}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        print(f"runlog: {type(err).__name__}: {err}", file=sys.stderr)
        return EXIT_FOUND
    return _unexpected(err)


def _let_go(err: BaseException) -> None:
    """Drop what ``err`` holds of the frames it passed through. A Kafka client keeps the error its
    callback raised (an :class:`AuthenticationFailed`), and that error's traceback held the frames
    that hold the client: a cycle the garbage collector cannot see, so the client lived until the
    interpreter's exit, whose teardown of librdkafka beside OpenSSL's could end the process with
    SIGSEGV after its one line was printed (exit -11 instead of 4)."""
    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        nxt = e.__cause__ or e.__context__
        e.__traceback__ = None
        e.__cause__ = e.__context__ = None
        e = nxt


def _unexpected(err: Exception) -> int:
    """A driver error no command translated: a service that cannot be reached is exit 3 with one
    line; anything else is one line naming the error, and ``RUNLOG_TRACEBACK=1`` prints its
    traceback (for a bug report)."""
    import os
    import traceback

    if _redis_cluster_moved(err):
        return _cluster_url_line()
    if _redis_unreachable(err):
        return _redis_unreachable_line(err)
    if _kafka_unreachable(err):
        print(f"runlog: Kafka cannot be reached at {settings_hint()}: {err}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if os.environ.get("RUNLOG_TRACEBACK") == "1":
        traceback.print_exception(err)
    print(f"runlog: unexpected {type(err).__name__}: {err} (RUNLOG_TRACEBACK=1 prints where)",
          file=sys.stderr)
    return EXIT_FOUND


def _kafka_unreachable(err: BaseException) -> bool:
    """Whether ``err`` is, at any depth, a Kafka client's error saying no broker answered."""
    from confluent_kafka import KafkaError, KafkaException

    down = (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT, KafkaError._RESOLVE)
    return any(isinstance(e, KafkaException) and e.args and isinstance(e.args[0], KafkaError)
               and e.args[0].code() in down for e in causes(err))


def _detach_stdout() -> None:
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is no file (captured): nothing to detach
        pass
    finally:
        os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
