"""The private services a chaos run starts and faults: a Toxiproxy server, a single-node KRaft broker and
a Redis, on free ports of their own (never the shared ones), every Runlog process role reaching both
through proxies of its own.

Each role (``worker``, ``resumer``, ``projector``) has a broker listener whose *advertised* address is
a Toxiproxy proxy in front of it (a client that reconnects to the address the broker advertised still
goes through its proxy), and a proxy in front of Redis. The ``INTERNAL`` listener and the direct Redis
address are the harness's: counting at the end reads the log and Redis whatever the faults did.

The broker is restarted on its data (``SIGTERM`` or ``SIGKILL``, then the same command); Redis keeps its
data in an append-only file synced on every write, so a ``SIGKILL`` and a restart lose nothing acknowledged
(what a failover to an in-sync replica gives).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import textwrap
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runlog.processors.chaos.reaper import Reaper
from runlog.processors.chaos.toxiproxy import Toxiproxy
from runlog.schemas import ConfigError, Settings

__all__ = ["ROLES", "Services", "free_ports", "prepare_broker", "stop_process"]

ROLES = ("worker", "resumer", "projector")

_ROOT = Path(__file__).resolve().parents[2]


def free_ports(n: int, low: int = 21000, high: int = 21999) -> list[int]:
    """``n`` distinct ports in [low, high] that nothing listens on now, picked at random."""
    out: list[int] = []
    for _ in range(10_000):
        if len(out) == n:
            return out
        port = random.randint(low, high)
        if port in out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        out.append(port)
    raise ConfigError(f"no {n} free ports in {low}-{high}")


def _local_dir() -> Path:
    return Path(os.environ.get("RUNLOG_LOCAL_DIR") or _ROOT / ".runlog")


def _java() -> str:
    for cand in (os.environ.get("RUNLOG_JAVA"),
                 os.environ.get("JAVA_HOME") and os.path.join(os.environ["JAVA_HOME"], "bin", "java"),
                 shutil.which("java")):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise ConfigError("no java: a chaos run starts a broker of its own (install a JDK or set RUNLOG_JAVA)")


def _libs() -> Path:
    libs = _local_dir() / "kafka" / "libs"
    if not libs.is_dir() or not any(libs.glob("kafka_2.13-*.jar")):
        raise ConfigError(f"no Kafka jars in {libs}: run deploy/local/up once (or set RUNLOG_LOCAL_DIR)")
    return libs


def _toxiproxy_bin() -> Path:
    path = _local_dir() / "bin" / "toxiproxy-server"
    if not path.is_file():
        raise ConfigError(f"no {path}: run deploy/local/toxiproxy build (or set RUNLOG_LOCAL_DIR)")
    return path


def stop_process(proc: subprocess.Popen[Any] | None, sig: int = signal.SIGTERM, wait: float = 30) -> None:
    """Send ``sig`` to a process still running, wait ``wait`` seconds for it, then SIGKILL it."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(wait)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def prepare_broker(d: Path, ctl: int, internal: int, real: Mapping[str, int], proxied: Mapping[str, int], *,
                   extra: str = "") -> list[str]:
    """Write a single-node KRaft broker's configuration under ``d`` and format its storage; returns the
    command that starts it. Listeners: ``CONTROLLER`` on ``ctl``, ``INTERNAL`` on ``internal`` (advertised
    as it is: the harness's), and per role one on ``real[role]`` advertised as ``proxied[role]`` (the
    address of the proxy in front of it). ``extra``: more ``key=value`` lines.

    Raises:
        ConfigError: no java, or no Kafka jars under ``RUNLOG_LOCAL_DIR``.
    """
    java, libs = _java(), _libs()
    d.mkdir(parents=True, exist_ok=True)
    names = {r: r.upper() for r in real}
    listeners = ",".join([f"CONTROLLER://127.0.0.1:{ctl}", f"INTERNAL://127.0.0.1:{internal}",
                          *(f"{names[r]}://127.0.0.1:{p}" for r, p in real.items())])
    advertised = ",".join([f"INTERNAL://127.0.0.1:{internal}",
                           *(f"{names[r]}://127.0.0.1:{p}" for r, p in proxied.items())])
    protocols = ",".join(f"{n}:PLAINTEXT" for n in ["CONTROLLER", "INTERNAL", *names.values()])
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
        """) + extra)
    cp = ["-cp", f"{libs}/*"]
    log4j = [f"-Dlog4j2.configurationFile={_ROOT / 'deploy' / 'kafka' / 'log4j2.properties'}",
             f"-Dkafka.logs.dir={d / 'logs'}"]
    small = ["-Xms64m", "-Xmx512m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Djava.awt.headless=true"]
    cluster_id = subprocess.run([java, *small, *cp, "kafka.tools.StorageTool", "random-uuid"],
                                capture_output=True, text=True, check=True, timeout=120).stdout.strip()
    subprocess.run([java, *small, *log4j, *cp, "kafka.tools.StorageTool", "format", "-t", cluster_id,
                    "-c", str(d / "server.properties")], capture_output=True, text=True, check=True,
                   timeout=120)
    return [java, *small, *log4j, *cp, "kafka.Kafka", str(d / "server.properties")]


@dataclass
class Services:
    """The private Toxiproxy, broker and Redis of one chaos run, files under ``root``."""

    root: Path
    proxy: Toxiproxy = field(init=False)
    internal: str = field(init=False, default="")
    """The harness's bootstrap address (no proxy)."""
    redis_direct: str = field(init=False, default="")
    """The harness's Redis URL (no proxy)."""
    kafka: dict[str, str] = field(init=False, default_factory=dict)
    """Role -> its bootstrap address (its proxy ``kafka-<role>``)."""
    redis: dict[str, str] = field(init=False, default_factory=dict)
    """Role -> its Redis URL (its proxy ``redis-<role>``)."""
    _tp: subprocess.Popen[bytes] | None = field(init=False, default=None)
    _broker: subprocess.Popen[bytes] | None = field(init=False, default=None)
    _redis: subprocess.Popen[bytes] | None = field(init=False, default=None)
    _redis_port: int = field(init=False, default=0)
    reaper: Reaper | None = None
    """Told each service's pid as it starts (:meth:`Reaper.track`): SIGKILLed should the run be killed."""
    _broker_cmd: list[str] = field(init=False, default_factory=list)

    # -- start and stop -----------------------------------------------------------------------

    def start(self, roles: Sequence[str] = ROLES) -> None:
        """Start all three and wait until each answers.

        Raises:
            ConfigError: java, the Kafka jars, redis-server or toxiproxy-server is missing, or one
                did not start (its log is named).
        """
        self.root.mkdir(parents=True, exist_ok=True)
        n = len(roles)
        ports = free_ports(4 + 4 * n)
        tp_port, ctl, internal, self._redis_port = ports[:4]
        real, proxied = ports[4:4 + n], ports[4 + n:4 + 2 * n]
        redis_proxied = ports[4 + 2 * n:4 + 3 * n]
        self._start_toxiproxy(tp_port)
        self._start_redis()
        for role, port in zip(roles, redis_proxied, strict=True):
            self.proxy.create(f"redis-{role}", port, f"127.0.0.1:{self._redis_port}")
            self.redis[role] = f"redis://127.0.0.1:{port}/0"
        self.redis_direct = f"redis://127.0.0.1:{self._redis_port}/0"
        for role, r, p in zip(roles, real, proxied, strict=True):
            self.proxy.create(f"kafka-{role}", p, f"127.0.0.1:{r}")
            self.kafka[role] = f"127.0.0.1:{p}"
        self.internal = f"127.0.0.1:{internal}"
        self._configure_broker(ctl, internal, dict(zip(roles, real, strict=True)),
                               dict(zip(roles, proxied, strict=True)))
        self.start_broker()

    def _track(self, proc: subprocess.Popen[bytes]) -> None:
        if self.reaper is not None:
            self.reaper.track(proc.pid)

    def stop(self) -> None:
        """Stop everything this object started (SIGTERM, then SIGKILL)."""
        stop_process(self._broker)
        stop_process(self._redis)
        stop_process(self._tp, wait=10)

    def _start_toxiproxy(self, port: int) -> None:
        with open(self.root / "toxiproxy.log", "ab") as out:
            self._tp = subprocess.Popen([str(_toxiproxy_bin()), "-host", "127.0.0.1", "-port", str(port)],
                                        stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                        start_new_session=True)
        self._track(self._tp)
        self.proxy = Toxiproxy(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 20
        while True:
            try:
                self.proxy.version()
                return
            except OSError:
                if self._tp.poll() is not None or time.monotonic() > deadline:
                    raise ConfigError(f"toxiproxy-server did not answer on {port} "
                                      f"(log: {self.root / 'toxiproxy.log'})") from None
                time.sleep(0.1)

    # -- Redis --------------------------------------------------------------------------------

    def start_redis(self) -> None:
        self._start_redis()

    def _start_redis(self) -> None:
        server = shutil.which("redis-server")
        if server is None:
            raise ConfigError("no redis-server: a chaos run starts a Redis of its own")
        d = self.root / "redis"
        d.mkdir(parents=True, exist_ok=True)
        with open(self.root / "redis.log", "ab") as out:
            self._redis = subprocess.Popen(
                [server, "--port", str(self._redis_port), "--bind", "127.0.0.1", "--dir", str(d),
                 "--save", "", "--appendonly", "yes", "--appendfsync", "always", "--protected-mode", "yes"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
        self._track(self._redis)
        deadline = time.monotonic() + 30
        import redis

        while True:
            try:
                redis.Redis(port=self._redis_port, socket_timeout=2).ping()
                return
            except redis.exceptions.RedisError:
                if self._redis.poll() is not None or time.monotonic() > deadline:
                    raise ConfigError(f"redis-server did not answer on {self._redis_port} "
                                      f"(log: {self.root / 'redis.log'})") from None
                time.sleep(0.1)

    def restart_redis(self, *, kill: bool, down_for: float) -> None:
        """Stop Redis (SIGKILL or SIGTERM), stay down ``down_for`` seconds, start it on its data."""
        stop_process(self._redis, signal.SIGKILL if kill else signal.SIGTERM)
        time.sleep(down_for)
        self._start_redis()

    # -- the broker ---------------------------------------------------------------------------

    def _configure_broker(self, ctl: int, internal: int, real: dict[str, int],
                          proxied: dict[str, int]) -> None:
        self._broker_cmd = prepare_broker(self.root / "kafka", ctl, internal, real, proxied, extra=(
            "broker.session.timeout.ms=3000\nbroker.heartbeat.interval.ms=1000\n"
            "num.recovery.threads.per.data.dir=1\n"))

    def start_broker(self, timeout: float = 120) -> None:
        """Start the broker on its data and wait until the harness's listener and every proxy answer."""
        with open(self.root / "kafka" / "kafka.out", "ab") as out:
            self._broker = subprocess.Popen(self._broker_cmd, stdin=subprocess.DEVNULL, stdout=out,
                                            stderr=out, start_new_session=True)
        self._track(self._broker)
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        for bootstrap in [self.internal, *self.kafka.values()]:
            while True:
                if self._broker.poll() is not None or time.monotonic() > deadline:
                    log = self.root / "kafka" / "kafka.out"
                    raise ConfigError(f"the chaos broker did not start (log: {log})")
                try:
                    md = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).list_topics(timeout=2)
                    if md.brokers:
                        break
                except KafkaException:
                    pass
                time.sleep(0.5)

    def restart_broker(self, *, kill: bool, down_for: float) -> None:
        """Stop the broker (SIGKILL: an unclean crash; SIGTERM: a controlled shutdown), stay down
        ``down_for`` seconds, start it on the same data."""
        stop_process(self._broker, signal.SIGKILL if kill else signal.SIGTERM, wait=60)
        time.sleep(down_for)
        self.start_broker()

    # -- settings -----------------------------------------------------------------------------

    def settings(self, base: Settings, role: str | None) -> Settings:
        """``base`` pointed at these services: through ``role``'s proxies, or directly (None: the harness)."""
        if role is None:
            return base.with_(kafka_bootstrap_servers=self.internal, redis_url=self.redis_direct)
        return base.with_(kafka_bootstrap_servers=self.kafka[role], redis_url=self.redis[role])
