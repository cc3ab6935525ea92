"""The ``runlog`` command line: subcommands over Runlog's components.

Exit codes: 0 success, 1 the command ran and found a problem (a failed check,
a difference, a blocked run), 2 bad usage or configuration, 3 a service could
not be reached, 4 the Kafka broker refused the credentials.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Protocol

from runlog.processors._tracing import command_span
from runlog.processors.cli.codes import EXIT_AUTH, EXIT_FOUND, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE
from runlog.producers.crash import arm_from_env
from runlog.schemas._kafka_auth import quiet_auth_lines
from runlog.schemas.errors import AuthenticationFailed, ConfigError, RunlogError

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
)


class _Registers(Protocol):
    def register(self, sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None: ...


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
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _COMMAND_MODULES:
        module: _Registers = importlib.import_module(name)
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``runlog`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    arm_from_env()  # fault tests only: RUNLOG_CRASH_AT names a point where the process kills itself
    func: Callable[[argparse.Namespace], int] = args.func
    quiet_auth_lines()  # an authentication failure is reported here, once, not in librdkafka's lines too
    try:
        with command_span(args):  # an operator command is a span; what it appends carries its context
            return func(args)
    except AuthenticationFailed as err:
        print(f"runlog: {err}", file=sys.stderr)
        return EXIT_AUTH
    except ConfigError as err:
        print(f"runlog: configuration error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except RunlogError as err:
        print(f"runlog: {type(err).__name__}: {err}", file=sys.stderr)
        return EXIT_FOUND
    except KeyboardInterrupt:
        print("runlog: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
