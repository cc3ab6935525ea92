"""Members started before their Redis (compose, a rollout, a host booting; or a Redis restarting as a
member starts, which two resumers of a chaos run met): ``runlog project``, ``resumer`` and ``worker``
wait for it (``RUNLOG_STARTUP_WAIT_MS``), one line per try, then serve; they give up after the wait
with exit 3; a refused password is not waited for. A real redis-server is started on the port the
members were given, after they have said they wait. The projector also waits for Kafka (a bootstrap
port that starts forwarding to the real broker once it has said so)."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from runlog.schemas import Settings
from tests.conftest import ROOT, require

from .harness import env_of, free_port, stop, wait_until

pytestmark = pytest.mark.integration

APP = "tests.integration.resume._scheduled:app"
MEMBERS = {
    "project": (["project", "--app-id", "startup"], "runlog project: starting"),
    "resumer": (["resumer", "--app", APP], "resumer: serving group"),
    "worker": (["worker", "--app", APP], "worker: serving group"),
}
WAITING = "waiting for the services"


@contextmanager
def _redis(port: int, workdir: Path, *args: str) -> Iterator[None]:
    server = shutil.which("redis-server")
    require(server is not None, "no redis-server (deploy/local/up installs it)")
    assert server is not None
    workdir.mkdir(parents=True, exist_ok=True)
    with open(workdir / "redis.log", "wb") as log:
        proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no", "--dir", str(workdir), *args],
                                stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        def up() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                assert proc.poll() is None, (workdir / "redis.log").read_text()[-500:]
                return False
        assert wait_until(up, 20, every=0.1), "redis-server did not listen"
        yield
    finally:
        proc.terminate()
        proc.wait(10)


@contextmanager
def _forwarder(port: int, target: str) -> Iterator[None]:
    """A TCP forwarder from 127.0.0.1:``port`` to ``target`` (host:port): a bootstrap server that starts
    answering when it opens. The metadata it passes on names the real broker, which clients then use."""
    host, _, tport = target.rpartition(":")
    listener = socket.create_server(("127.0.0.1", port))
    closing = threading.Event()

    def pump(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                s.close()

    def serve() -> None:
        while not closing.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection((host, int(tport)))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=pump, args=(a, b), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield
    finally:
        closing.set()
        listener.close()


def _start(settings: Settings, argv: list[str], log: Path, **env: str) -> subprocess.Popen[bytes]:
    with open(log, "ab") as err:
        return subprocess.Popen([sys.executable, "-m", "runlog", *argv], cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=err, env=env_of(settings, RUNLOG_METRICS_PORT="0", **env))


def _waiting(settings: Settings, tmp_path: Path, member: str, *, lines: int) -> tuple[
        subprocess.Popen[bytes], Path, int]:
    """``member`` started against a port with no Redis (a minute's wait), once it has said ``lines``
    times that it waits, or has exited: the process, its log and the port."""
    port = free_port()
    log = tmp_path / f"{member}.log"
    proc = _start(settings, MEMBERS[member][0], log, REDIS_URL=f"redis://127.0.0.1:{port}/0",
                  RUNLOG_STARTUP_WAIT_MS="60000")
    said = lambda: log.read_text().count(WAITING)  # noqa: E731
    try:
        assert wait_until(lambda: said() >= lines or proc.poll() is not None, 60, every=0.2), log.read_text()
    except BaseException:
        stop(proc, signal.SIGKILL)
        raise
    return proc, log, port


@pytest.mark.parametrize("member", sorted(MEMBERS))
def test_a_member_started_before_its_redis_waits_for_it_then_serves(
        topics: Settings, tmp_path: Path, member: str) -> None:
    ready = MEMBERS[member][1]
    proc, log, port = _waiting(topics, tmp_path, member, lines=2)
    try:
        assert proc.poll() is None, log.read_text()  # it waits: before, it exited 3 here
        with _redis(port, tmp_path / "redis"):
            assert wait_until(lambda: ready in log.read_text() or proc.poll() is not None, 60, every=0.2), \
                log.read_text()
            assert proc.poll() is None, log.read_text()
            text = log.read_text()
            who = "runlog project" if member == "project" else member
            assert f"{who}: {WAITING}: Redis did not answer" in text, text
            assert text.index(ready) > text.rindex(WAITING)
            stop(proc)
            assert proc.returncode == 0, log.read_text()
    finally:
        stop(proc, signal.SIGKILL)


def test_a_member_gives_up_after_the_wait_with_exit_3_and_no_password_in_its_lines(
        topics: Settings, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "resumer.log"
    started = time.monotonic()
    proc = _start(topics, MEMBERS["resumer"][0], log, REDIS_URL=f"redis://:pw-startup-9@127.0.0.1:{port}/0",
                  RUNLOG_STARTUP_WAIT_MS="2500")
    rc = proc.wait(60)
    took = time.monotonic() - started
    text = log.read_text()
    assert rc == 3, text
    assert took >= 2.5, took
    assert text.count(WAITING) >= 2, text  # 0.5 s, 1 s, then the rest of the 2.5 s
    assert text.rstrip().splitlines()[-1].startswith("runlog: Redis cannot be reached"), text
    assert "pw-startup-9" not in text and "Traceback" not in text, text


def test_a_refused_password_is_not_waited_for(topics: Settings, tmp_path: Path) -> None:
    port = free_port()
    with _redis(port, tmp_path / "redis", "--requirepass", "the-right-one"):
        log = tmp_path / "worker.log"
        started = time.monotonic()
        proc = _start(topics, MEMBERS["worker"][0], log, REDIS_URL=f"redis://:a-wrong-one@127.0.0.1:{port}/0",
                      RUNLOG_STARTUP_WAIT_MS="60000")
        rc = proc.wait(60)
        text = log.read_text()
        assert rc == 3 and time.monotonic() - started < 30, text
        assert WAITING not in text and "a-wrong-one" not in text, text
        assert "runlog: Redis cannot be reached" in text and "password" in text, text


def test_the_projector_started_before_kafka_answers_waits_for_it_then_serves(
        topics: Settings, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "project.log"
    argv, ready = MEMBERS["project"]
    proc = _start(topics, argv, log, KAFKA_BOOTSTRAP_SERVERS=f"127.0.0.1:{port}",
                  RUNLOG_STARTUP_WAIT_MS="90000")
    try:
        # each try lists the topics for up to 10 s before it fails
        assert wait_until(lambda: WAITING in log.read_text() or proc.poll() is not None, 60, every=0.2), \
            log.read_text()
        assert proc.poll() is None, log.read_text()
        assert "runlog project: waiting for the services: listing the topics failed" in log.read_text()
        with _forwarder(port, topics.kafka_bootstrap_servers):
            joined = lambda: "assigned" in log.read_text() or proc.poll() is not None  # noqa: E731
            assert wait_until(joined, 90, every=0.2), log.read_text()
            assert proc.poll() is None, log.read_text()
            assert ready in log.read_text()
            stop(proc)
            assert proc.returncode == 0, log.read_text()
    finally:
        stop(proc, signal.SIGKILL)


@pytest.mark.parametrize("member", sorted(MEMBERS))
def test_sigterm_while_a_member_waits_stops_it_with_exit_0(
        topics: Settings, tmp_path: Path, member: str) -> None:
    ready = MEMBERS[member][1]
    proc, log, _port = _waiting(topics, tmp_path, member, lines=1)
    try:
        assert proc.poll() is None, log.read_text()
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(20)
        text = log.read_text()
        assert rc == 0, text  # before: killed by the signal (-15)
        assert time.monotonic() - sent < 5, text  # the pause is cut short, not slept out
        who = "runlog project" if member == "project" else member
        assert f"{who}: SIGTERM while waiting for the services: stopping" in text, text
        assert ready not in text and "Traceback" not in text, text
    finally:
        stop(proc, signal.SIGKILL)
