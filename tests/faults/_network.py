"""The network fault matrix's services: a Toxiproxy server, and a private broker whose clients go through it.

:func:`toxiproxy_running` starts ``toxiproxy-server`` (built from its Go module by
``deploy/local/toxiproxy build`` into ``.runlog/bin/``) on a free port in 2xxxx and hands out a
:class:`Toxiproxy` client of its REST API. :func:`proxied_broker_running` starts a single-node KRaft
broker from the jar cache of ``deploy/local/up`` with one client listener per Runlog process role; each
listener's *advertised* address is a proxy in front of it, so a client that reconnects to the address the
broker advertised still goes through its proxy (a proxy in front of a shared broker's port alone would be
bypassed after the first metadata answer). The ``INTERNAL`` listener is advertised as it is: the broker's
own and the test harness's (which must see the log whatever the fault).
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from runlog.processors.chaos.services import free_ports, prepare_broker, stop_process
from runlog.processors.chaos.toxiproxy import Toxiproxy

PORTS = (22000, 22999)
"""Where this matrix picks its free ports: ``runlog chaos`` picks from 21000-21999, and deploy/test runs
the chaos test beside this one (tests/conftest.py ``SERIAL_LANES``)."""

__all__ = ["PORTS", "ProxiedBroker", "Toxiproxy", "free_ports", "proxied_broker_running", "toxiproxy_binary",
           "toxiproxy_running"]

ROOT = Path(__file__).resolve().parents[2]


def toxiproxy_binary() -> tuple[Path | None, str]:
    """``deploy/local/toxiproxy build``: the binary (built on the first call, found afterwards), or None
    and the script's error."""
    proc = subprocess.run([str(ROOT / "deploy" / "local" / "toxiproxy"), "build"], capture_output=True,
                          text=True, timeout=900, check=False)
    path = Path(proc.stdout.strip()) if proc.returncode == 0 and proc.stdout.strip() else None
    return (path if path is not None and path.is_file() else None), proc.stderr[-2000:]


@contextmanager
def toxiproxy_running(d: Path, binary: Path) -> Iterator[Toxiproxy]:
    """A ``toxiproxy-server`` of this test's own on a free port (log in ``d``), stopped on exit."""
    (port,) = free_ports(1, *PORTS)
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "toxiproxy.log", "wb") as out:
        proc = subprocess.Popen([str(binary), "-host", "127.0.0.1", "-port", str(port)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
    client = Toxiproxy(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                client.version()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"toxiproxy-server did not answer on {port}: "
                                       f"{(d / 'toxiproxy.log').read_text()[-2000:]}") from None
                time.sleep(0.1)
        yield client
    finally:
        stop_process(proc, wait=10)


@dataclass(frozen=True)
class ProxiedBroker:
    internal: str
    """The bootstrap address the harness uses (advertised as it is, no proxy)."""
    clients: dict[str, str]
    """Role -> the bootstrap address of its listener: its proxy's address, which the broker advertises."""
    proc: subprocess.Popen[bytes]
    dir: Path


@contextmanager
def proxied_broker_running(d: Path, proxy: Toxiproxy, roles: Sequence[str]) -> Iterator[ProxiedBroker]:
    """A broker with its files under ``d``: per role a listener on a free port, advertised as the address
    of a Toxiproxy proxy ``kafka-<role>`` in front of it (created here). Stopped on exit.

    Raises:
        ConfigError: Java or the jar cache is missing (``prepare_broker``).
        RuntimeError: the broker did not start.
    """
    ports = free_ports(3 + 2 * len(roles), *PORTS)
    ctl, internal = ports[0], ports[1]
    real = dict(zip(roles, ports[3:3 + len(roles)], strict=True))
    proxied = dict(zip(roles, ports[3 + len(roles):], strict=True))
    command = prepare_broker(d, ctl, internal, real, proxied)
    for r in roles:
        proxy.create(f"kafka-{r}", proxied[r], f"127.0.0.1:{real[r]}")
    with open(d / "kafka.out", "wb") as out:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True)
    broker = ProxiedBroker(f"127.0.0.1:{internal}", {r: f"127.0.0.1:{proxied[r]}" for r in roles}, proc, d)
    try:
        if not _ready(broker):
            raise RuntimeError(f"the proxied broker did not start:\n{(d / 'kafka.out').read_text()[-3000:]}")
        yield broker
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _ready(broker: ProxiedBroker, timeout: float = 120) -> bool:
    """Every listener answers metadata through its proxy, and an idempotent producer's first write is
    acknowledged (the coordinator loaded)."""
    from confluent_kafka import KafkaException, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    deadline = time.monotonic() + timeout
    for bootstrap in [broker.internal, *broker.clients.values()]:
        while True:
            if broker.proc.poll() is not None or time.monotonic() > deadline:
                return False
            try:
                AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=2)
                break
            except KafkaException:
                time.sleep(0.5)
    admin = AdminClient({"bootstrap.servers": broker.internal})
    admin.create_topics([NewTopic("warm-up", 1, 1)])["warm-up"].result(30)
    p = Producer({"bootstrap.servers": broker.internal, "enable.idempotence": True})
    p.produce("warm-up", b"x")
    return p.flush(60) == 0
