"""Bad input to the ``runlog`` command line is one line and a documented exit code, never a traceback:
a time that is no time, an ``--app`` given as a path, a reader that closes the pipe early."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from runlog.processors.cli import EXIT_OK, EXIT_USAGE, main
from runlog.processors.resume import load_app
from runlog.schemas import ConfigError


@pytest.mark.parametrize("at", ["notatime", "2026-13-45"])
def test_show_at_a_time_that_is_no_time_is_a_usage_error(at: str, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")  # never reached: refused before
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    assert main(["show", "run-x", "--at", at]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert repr(at) in err


APP = textwrap.dedent("""
    from runlog import App, DictInputSource, Workflow

    wf = Workflow("greet", version="1")


    @wf.stage("hello")
    def hello(ctx, inputs):
        return {"hi": 1}


    app = App.of([wf], [], DictInputSource({}), name="greet-from-a-path")
""")


@pytest.mark.parametrize("spec", ["{dir}/greet:app", "{dir}/greet.py:app", "../{name}/greet:app",
                                  "./greet:app"])
def test_an_app_given_as_a_path_loads(spec: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "apps"
    folder.mkdir()
    (folder / "greet.py").write_text(APP)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(folder if spec.startswith("./") else tmp_path / "elsewhere")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "greet", raising=False)
    app = load_app(spec.format(dir=folder, name=folder.name))
    assert app.name == "greet-from-a-path"


@pytest.mark.parametrize("spec", ["../nowhere/greet:app", "./greet.py:app", "a..b:app", "greet"])
def test_an_app_that_cannot_load_is_a_configuration_error(spec: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(ConfigError):
        load_app(spec)


CHATTY = textwrap.dedent("""
    import argparse, sys
    import runlog.processors.cli as cli

    built = cli.build_parser


    def build_parser():  # a command that prints far more than a pipe holds
        parser = built()
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub.add_parser("chatty").set_defaults(func=lambda args: [print("x") for _ in range(200_000)] and 0)
        return parser


    cli.build_parser = build_parser
    sys.exit(cli.main(sys.argv[1:]))
""")


@pytest.mark.parametrize("argv", ["chatty", "--help"])
def test_a_reader_that_closes_the_pipe_early_gets_no_traceback(argv: str, tmp_path: Path) -> None:
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY)
    proc = subprocess.run(f"{sys.executable} {script} {argv} | head -1; echo \"exit ${{PIPESTATUS[0]}}\"",
                          shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=60)
    first, status = proc.stdout.splitlines()
    assert first and status == "exit 0", proc.stdout
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    import runlog

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == EXIT_OK
    assert capsys.readouterr().out.strip() == f"runlog {runlog.__version__}"


@pytest.mark.parametrize(("argv", "names"), [
    (["show", "run-x"], "the log cannot be read from Kafka at 127.0.0.1:1"),
    (["runs"], "Redis cannot be reached (REDIS_URL=redis://127.0.0.1:1/0)"),
])
def test_a_service_that_is_down_is_one_line_and_exit_3(argv: list[str], names: str, tmp_path: Path) -> None:
    """No librdkafka line per reconnect, no traceback, no password: one line naming the service."""
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "REDIS_URL": "redis://:pw-7@127.0.0.1:1/0"}
    proc = subprocess.run([sys.executable, "-m", "runlog", *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 3 and len(lines) == 1, proc.stderr[-2000:]
    assert names in lines[0] and "pw-7" not in proc.stderr


def test_without_the_variables_a_command_names_the_services_it_uses_first(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP_SERVERS", "REDIS_URL")}
    env["RUNLOG_TOPIC_PREFIX"] = "nowhere-"  # whatever answers there, nothing of it is touched
    proc = subprocess.run([sys.executable, "-m", "runlog", "show", "run-x", "--at", "no-time"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    first = proc.stderr.splitlines()[0]
    assert first.startswith("runlog: KAFKA_BOOTSTRAP_SERVERS and REDIS_URL not set: using 127.0.0.1:19092 "
                            "and redis://127.0.0.1:16379/0"), proc.stderr
    env["REDIS_URL"] = "redis://127.0.0.1:1/0"
    proc = subprocess.run([sys.executable, "-m", "runlog", "show", "run-x", "--at", "no-time"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    first = proc.stderr.splitlines()[0]
    assert first.startswith("runlog: KAFKA_BOOTSTRAP_SERVERS not set: using 127.0.0.1:19092 "), first


def test_a_segfault_in_a_runlog_command_leaves_the_python_stack_in_its_stderr() -> None:
    """A chaos run's projector member exited with signal 11 and an empty log: where it was is lost.
    The CLI turns on faulthandler, so a crash in a C extension prints every thread's stack."""
    code = ("import ctypes\n"
            "from runlog.processors.cli import dump_on_fatal_signal\n"
            "dump_on_fatal_signal()\n"
            "def inside_a_member():\n"
            "    ctypes.string_at(0)\n"
            "inside_a_member()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == -11, done
    assert "Fatal Python error: Segmentation fault" in done.stderr
    assert "inside_a_member" in done.stderr
