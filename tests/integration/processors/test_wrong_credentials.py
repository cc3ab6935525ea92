"""Every ``runlog`` command that talks to Kafka, run with the right broker but a wrong password
(the session's real SASL_SSL broker, :mod:`tests.integration._secure_broker`): one line naming
authentication on stderr, no traceback, the dedicated exit code (4), within seconds, and the
password printed nowhere. Before, the commands said "Broker transport failure", printed tracebacks,
repeated librdkafka's FAIL line about 24 times, and ``runlog resumer`` looped on and exited 0."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runlog.processors.cli.codes import EXIT_AUTH
from runlog.schemas import Settings
from tests.integration._secure_broker import USER, SecureBroker
from tests.integration.processors.harness import ROOT

pytestmark = pytest.mark.integration

WRONG = "wrong-" + os.urandom(6).hex()

COMMANDS: dict[str, list[str]] = {
    "doctor": ["doctor"],
    "init": ["init"],
    "demo": ["demo"],
    "resume": ["resume", "r-1"],
    "show": ["show", "r-1"],
    "project": ["project"],
    "runs": ["runs"],
    "rebuild": ["projections", "rebuild"],
    "audit": ["audit"],
    "smoke": ["smoke"],
    # --idle-exit only bounds a resumer that would loop on: it must stop at the failure, long before
    "resumer": ["resumer", "--app", "runlog.processors.demo.pipeline:app", "--idle-exit", "60"],
}
# lines a command prints before it meets the broker (the resumer's group, runs' note on its source)
BEFORE_BROKER = {"resumer": 2, "runs": 1}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_wrong_password_is_one_line_and_a_dedicated_exit_code(
        secure_broker: SecureBroker, settings: Settings, tmp_path: Path, command: str) -> None:
    s = settings.with_(kafka_bootstrap_servers=secure_broker.sasl_bootstrap,
                       kafka_extra={**secure_broker.sasl("SCRAM-SHA-512"), "sasl.password": WRONG})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNLOG_", "KAFKA_", "REDIS_"))}
    env.update(s.to_env())
    env["RUNLOG_METRICS_PORT"] = "0"
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "runlog", *COMMANDS[command]], cwd=tmp_path,
                         env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                         timeout=60, check=False)
    took = time.monotonic() - t0
    lines = out.stderr.splitlines()
    said = out.stdout + out.stderr
    assert out.returncode == EXIT_AUTH, said
    assert "Traceback" not in said and WRONG not in said, said
    auth = [ln for ln in lines if "authentication" in ln.lower()]
    assert len(auth) == 1 and auth[0].startswith("runlog: authentication failed: "), said
    assert f"user '{USER}'" in auth[0] and secure_broker.sasl_bootstrap in auth[0], said
    assert len(lines) <= 1 + BEFORE_BROKER.get(command, 0), said
    assert took < 30, f"{command} took {took:.1f}s"


def _clients() -> set[int]:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient

    gc.collect()
    return {id(o) for o in gc.get_objects() if isinstance(o, (AdminClient, Consumer, Producer))}


@pytest.mark.parametrize("command", [["init"], ["demo"], ["doctor"]])
def test_a_refused_command_leaves_no_kafka_client_alive(secure_broker: SecureBroker, settings: Settings,
                                                        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        command: list[str]) -> None:
    """The client whose callback raised the authentication error stayed alive until the interpreter's
    exit (the error, kept by the client, held the frames that held the client), and librdkafka's
    teardown there once ended ``runlog demo`` with SIGSEGV (exit -11) after its one line."""
    from runlog.processors.cli import main

    s = settings.with_(kafka_bootstrap_servers=secure_broker.sasl_bootstrap,
                       kafka_extra={**secure_broker.sasl("SCRAM-SHA-512"), "sasl.password": WRONG})
    for k in [k for k in os.environ if k.startswith(("RUNLOG_", "KAFKA_", "REDIS_"))]:
        monkeypatch.delenv(k)
    for k, v in s.to_env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)
    before = _clients()
    assert main(command) == EXIT_AUTH
    left = _clients() - before
    assert not left, f"{len(left)} Kafka client(s) of `runlog {command[0]}` still alive"
