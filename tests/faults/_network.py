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

import random
import signal
import socket
import subprocess
import textwrap
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from runlog.processors.chaos.toxiproxy import Toxiproxy
from tests.integration._secure_broker import _java, _libs, available

__all__ = ["ProxiedBroker", "Toxiproxy", "free_ports", "proxied_broker_running", "toxiproxy_binary",
           "toxiproxy_running"]

ROOT = Path(__file__).resolve().parents[2]


def free_ports(n: int, low: int = 21000, high: int = 28999) -> list[int]:
    """``n`` distinct ports in [low, high] that nothing listens on now, picked at random (not the kernel's
    ephemeral range, so no client connection holds one meanwhile)."""
    out: list[int] = []
    while len(out) < n:
        port = random.randint(low, high)
        if port in out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        out.append(port)
    return out


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
    (port,) = free_ports(1)
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
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


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
        RuntimeError: Java or the jar cache is missing, or the broker did not start.
    """
    java, libs = _java(), _libs()
    if java is None or not available():
        raise RuntimeError("no Java or no Kafka jar cache (deploy/local/up fetches it)")
    d.mkdir(parents=True, exist_ok=True)
    ports = free_ports(3 + 2 * len(roles))
    ctl, internal = ports[0], ports[1]
    names = [r.upper() for r in roles]
    real = dict(zip(roles, ports[3:3 + len(roles)], strict=True))
    proxied = dict(zip(roles, ports[3 + len(roles):], strict=True))
    listeners = ",".join([f"CONTROLLER://127.0.0.1:{ctl}", f"INTERNAL://127.0.0.1:{internal}",
                          *(f"{n}://127.0.0.1:{real[r]}" for n, r in zip(names, roles, strict=True))])
    advertised = ",".join([f"INTERNAL://127.0.0.1:{internal}",
                           *(f"{n}://127.0.0.1:{proxied[r]}" for n, r in zip(names, roles, strict=True))])
    protocols = ",".join(f"{n}:PLAINTEXT" for n in ["CONTROLLER", "INTERNAL", *names])
    (d / "server.properties").write_text(textwrap.dedent(f"""\
        process.roles=broker,controller
        node.id=1
        controller.quorum.voters=1@127.0.0.1:{ctl}
        listeners={listeners}
        advertised.listeners={advertised}
        controller.listener.names=CONTROLLER
        inter.broker.listener.name=INTERNAL
        listener.security.protocol.map={protocols}
        log.dirs={d / "data"}
        default.replication.factor=1
        min.insync.replicas=1
        offsets.topic.replication.factor=1
        offsets.topic.num.partitions=1
        transaction.state.log.replication.factor=1
        transaction.state.log.min.isr=1
        transaction.state.log.num.partitions=1
        share.coordinator.state.topic.replication.factor=1
        share.coordinator.state.topic.min.isr=1
        group.initial.rebalance.delay.ms=0
        auto.create.topics.enable=false
        num.network.threads=2
        num.io.threads=2
        background.threads=1
        log.cleaner.threads=1
        """))
    for r in roles:
        proxy.create(f"kafka-{r}", proxied[r], f"127.0.0.1:{real[r]}")
    cp = ["-cp", f"{libs}/*"]
    log4j = [f"-Dlog4j2.configurationFile={ROOT / 'deploy' / 'kafka' / 'log4j2.properties'}",
             f"-Dkafka.logs.dir={d / 'logs'}"]
    small = ["-Xms64m", "-Xmx512m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Djava.awt.headless=true"]
    cluster_id = subprocess.run([java, *small, *cp, "kafka.tools.StorageTool", "random-uuid"],
                                capture_output=True, text=True, check=True, timeout=120).stdout.strip()
    subprocess.run([java, *small, *log4j, *cp, "kafka.tools.StorageTool", "format", "-t", cluster_id,
                    "-c", str(d / "server.properties")],
                   capture_output=True, text=True, check=True, timeout=120)
    with open(d / "kafka.out", "wb") as out:
        proc = subprocess.Popen([java, *small, *log4j, *cp, "kafka.Kafka", str(d / "server.properties")],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
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
