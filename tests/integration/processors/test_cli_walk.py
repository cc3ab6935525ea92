"""Every ``runlog`` command, walked through bad values (unknown runs, malformed options) with the
services down and with them up: each ends with a documented exit code and a line on stderr, never a
traceback. The commands are read from the parser, so a new command is walked without being named."""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runlog.schemas import Settings
from tests.docs._examples import hook

pytestmark = pytest.mark.integration

#: commands that serve until stopped (walked in the services-down pass only where they give up)
SERVERS = {"console", "project", "resumer", "worker", "demo", "smoke", "bench", "init", "chaos"}
"""Commands that run until stopped or for minutes on services of their own (``chaos`` starts a private
broker): not walked; their usage errors have tests of their own, their ``--help`` is walked below."""
DOWN = {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "REDIS_URL": "redis://127.0.0.1:1/0",
        # members (project, resumer, worker) would wait a minute for the services to come up: the walk
        # checks how they give up; the wait has tests of its own (tests/integration/test_startup_wait.py)
        "RUNLOG_STARTUP_WAIT_MS": "0"}


def _leaves() -> list[tuple[tuple[str, ...], list[str]]]:
    """(command path, argv with bad values for its required arguments) of every leaf command, read
    from the parser as the CLI reference is (``docs/_hooks/generate.py``'s ``commands``)."""
    out = []
    for path, _, sub in hook().commands():
        if any(isinstance(a, argparse._SubParsersAction) for a in sub._actions):
            continue
        argv = list(path)
        for a in sub._actions:
            if a.option_strings:
                if a.required:
                    argv += [a.option_strings[0], "x"]  # not a module:attribute, not a number
            elif a.dest != "help" and a.nargs not in ("?", "*"):
                argv.append("run-nope")
        out.append((path, argv))
    return out


def _walk(argvs: list[list[str]], env: dict[str, str], cwd: Path) -> list[tuple[str, int, str]]:
    def run(argv: list[str]) -> tuple[str, int, str]:
        proc = subprocess.run([sys.executable, "-m", "runlog", *argv], env=env, cwd=cwd, capture_output=True,
                              text=True, timeout=120)
        return " ".join(argv), proc.returncode, proc.stderr

    # 8 at once: most of a walk's time is commands waiting on a service that does not answer
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return list(pool.map(run, argvs))


def _check(results: list[tuple[str, int, str]], codes: set[int]) -> None:
    """No traceback; a command given a run nobody has (or a value that is none) ends in ``codes``
    with a line on stderr; one given nothing to find (``runs``, ``audit``) may also answer 0."""
    bad = [(cmd, rc, err[-600:]) for cmd, rc, err in results
           if "Traceback" in err or rc not in (codes if _asks(cmd) else {0, *codes})]
    assert not bad, bad
    silent = [cmd for cmd, rc, err in results if rc != 0 and not err.strip() and not cmd.startswith("doctor")]
    assert not silent, f"refused without a word on stderr: {silent}"  # doctor reports on stdout


def _asks(cmd: str) -> bool:
    """Whether ``cmd`` asks about something that does not exist (a run, a value that is none): a
    submission of a workflow named ``run-nope`` is a submission (no worker registers it yet)."""
    return not cmd.startswith("submit ") and ("run-nope" in cmd.split() or " x" in cmd)


def test_every_command_with_the_services_down_is_one_documented_exit(tmp_path: Path) -> None:
    leaves = _leaves()
    # console serves pages with Redis down; chaos starts services of its own (it does not use these)
    walked = [argv for path, argv in leaves if path[0] not in ("console", "chaos")]
    assert len(walked) >= 25, walked
    results = _walk(walked, {**os.environ, **DOWN}, tmp_path)
    _check(results, {1, 2, 3})
    reached = {cmd for cmd, rc, _ in results if rc == 3}
    assert {"show run-nope", "runs", "resume run-nope", "audit", "projections rebuild"} <= reached, reached


def test_every_command_with_bad_values_against_the_real_services(topics: Settings, tmp_path: Path) -> None:
    leaves = _leaves()
    walked = [argv for path, argv in leaves if path[0] not in SERVERS]
    env = {**os.environ, **topics.to_env(), "RUNLOG_TOPIC_PREFIX": f"{topics.topic_prefix}absent."}
    _check(_walk(walked, env, tmp_path), {1, 2, 3})
    env = {**os.environ, **topics.to_env()}
    results = _walk(walked, env, tmp_path)  # the topics exist; the run does not
    _check(results, {1, 2})
    by = {cmd: err for cmd, _, err in results}
    assert "no run 'run-nope'" in by["tail run-nope"] and "no events for 'run-nope'" in by["show run-nope"]


#: bad values of each kind, where a command takes one: times, offsets, JSON, paths, assignments
BAD_VALUES = [
    ["show", "run-nope", "--at", "2026-13-45"], ["show", "run-nope", "--at", "notatime"],
    ["audit", "--since", "notatime"], ["audit", "--until", "2026-13-45"],
    ["audit", "--from-offset", "10", "--to-offset", "5"], ["audit", "--from-offset", "-1"],
    ["tail", "run-nope", "--from", "-5"], ["signal", "run-nope", "approval", "--data", "{bad", "--by", "x"],
    ["resume", "run-nope", "--dry-run", "--app", "../nowhere/app:app"],
    ["upgrade", "run-nope", "--to", "2", "--app", "./nowhere:app", "--by", "x", "--reason", "y"],
    ["replay", "run-nope", "--app", "x:y", "--set", "oops"], ["branch", "run-nope", "--input", "facts"],
    ["submit", "wf", "--params", "[1]"], ["submit", "wf", "--params", "{bad"],
    ["schedule", "add", "nightly", "--workflow", "wf", "--every", "10s", "--params", "nope"],
]


def test_bad_values_of_every_kind_are_one_line(topics: Settings, tmp_path: Path) -> None:
    results = _walk(BAD_VALUES, {**os.environ, **topics.to_env()}, tmp_path)
    _check(results, {1, 2})
    assert all(len(err.strip().splitlines()) <= 2 for _, _, err in results), results


def test_every_command_with_the_schema_registry_down(topics: Settings, tmp_path: Path) -> None:
    """With a registry configured that does not answer, a command that reads or writes the log
    refuses with one configuration line (exit 2); one that only reads the projection may answer."""
    leaves = _leaves()
    walked = [argv for path, argv in leaves if path[0] not in SERVERS]
    env = {**os.environ, **topics.to_env(), "RUNLOG_SCHEMA_REGISTRY_URL": "http://127.0.0.1:1"}
    results = _walk(walked, env, tmp_path)
    _check(results, {1, 2, 3})
    by = {cmd: (rc, err) for cmd, rc, err in results}
    rc, err = by["show run-nope"]
    assert rc == 2 and "schema registry" in err and "unreachable" in err, err


@pytest.mark.parametrize("command", sorted(SERVERS))
def test_servers_answer_help(command: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "runlog", command, "--help"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and f"usage: runlog {command}" in proc.stdout, proc.stderr
