"""Every ``runlog`` subcommand, and every option and argument of each, says what it is for (issue 25):
``runlog X --help`` and the generated reference (docs/reference/cli.md) show these texts."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from runlog.processors.cli import build_parser


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("runlog",)) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


COMMANDS = dict(_commands(build_parser()))


def _undocumented(parser: argparse.ArgumentParser) -> list[str]:
    missing: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        name = "/".join(action.option_strings) or action.dest
        if isinstance(action, argparse._SubParsersAction):  # each subcommand's one-line help
            helped = {c.dest: (c.help or "").strip() for c in action._choices_actions}
            missing += [f"subcommand {n}" for n in action.choices if not helped.get(n)]
        elif action.help is argparse.SUPPRESS or not (action.help or "").strip():
            missing.append(name)
    return missing


def test_the_walk_finds_every_command() -> None:
    names = {" ".join(p[1:]) for p in COMMANDS}
    assert {"branch", "resolve", "resume", "runs", "show", "projections rebuild", "schemas register"} <= names
    assert len(COMMANDS) > 20


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=lambda p: " ".join(p))
def test_every_option_and_argument_has_a_help_text(path: tuple[str, ...]) -> None:
    assert _undocumented(COMMANDS[path]) == [], f"`{' '.join(path)}`: no help text"


def test_a_missing_help_text_is_found() -> None:
    p = argparse.ArgumentParser(prog="x")
    sub = p.add_subparsers()
    q = sub.add_parser("y", help="does y")
    q.add_argument("run_id")
    q.add_argument("--json", action="store_true", help=" ")
    sub.add_parser("z")
    assert _undocumented(p) == ["subcommand z"]
    assert _undocumented(q) == ["run_id", "--json"]


def test_branch_describes_its_options() -> None:
    text = COMMANDS[("runlog", "branch")].format_help()
    for option in ("run_id", "--input", "--app", "--json"):
        assert option in text
    assert "new version" in text and "module:attribute" in text


_HEAVY = ("redis", "faust", "aiokafka", "opentelemetry", "fastavro", "runlog.producers.run")
"""What a command that runs imports, and ``runlog --help`` or a refused argument has no use for: with
them the command line took 0.9 s to print its help (redis alone, beside opentelemetry, 0.5 s)."""


@pytest.mark.parametrize("argv", [["--help"], ["worker", "--no-such-option"], ["runs", "--help"]])
def test_help_and_a_refused_argument_load_no_client(argv: list[str]) -> None:
    import json
    import subprocess
    import sys

    probe = (
        "import json, sys\n"
        "from runlog.processors.cli import build_parser\n"
        f"try:\n    build_parser().parse_args({argv!r})\n"
        "except SystemExit as e:\n    code = e.code\n"
        f"heavy = sorted({{m for m in sys.modules if m.startswith({_HEAVY!r})}})\n"
        "print(json.dumps([code, heavy]), file=sys.stderr)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    code, heavy = json.loads(out.stderr.strip().splitlines()[-1])
    assert code == (0 if "--help" in argv else 2)
    assert heavy == [], f"runlog {' '.join(argv)} imported {heavy}"
