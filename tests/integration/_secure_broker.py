"""A real single-node SASL_SSL / mutual-TLS Kafka broker (KRaft) for the tests that need one.

It runs from the jar cache of ``deploy/local/up`` (``.runlog/kafka/libs``): a SASL_SSL listener
(PLAIN, SCRAM-SHA-256, SCRAM-SHA-512; SCRAM users added at format time) and an SSL listener that
requires a client certificate, both with a server certificate from a throw-away CA, on free ports.
It takes about 5 s to start. :func:`secure_broker_running` starts and stops one; the
``secure_broker`` fixture (``tests/integration/processors/conftest.py``) shares one per session,
skipped (failed under CI) when the jars or Java are missing.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import rsa

from runlog.processors.chaos.services import stop_process
from runlog.schemas import Settings
from tests.unit.processors.test_projector_settings import Pki, make_pki

__all__ = ["LEAST", "LEAST_PASSWORD", "PASSWORD", "USER", "SecureBroker", "available",
           "secure_broker_running"]

ROOT = Path(__file__).resolve().parents[2]
USER, PASSWORD = "svc", "svc-secret-" + os.urandom(4).hex()
LEAST, LEAST_PASSWORD = "least", "least-secret-" + os.urandom(4).hex()
"""A second SCRAM user for least-privilege tests: the broker's authorizer allows what no ACL names
(``allow.everyone.if.no.acl.found``), so a test denies this user what it means to take away (``USER`` and
the plain-text listeners are super users)."""


def _libs() -> Path:
    base = Path(os.environ.get("RUNLOG_LOCAL_DIR") or ROOT / ".runlog")
    return base / "kafka" / "libs"


def _java() -> str | None:
    for cand in (os.environ.get("RUNLOG_JAVA"),
                 os.environ.get("JAVA_HOME") and os.path.join(os.environ["JAVA_HOME"], "bin", "java"),
                 shutil.which("java")):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


def available() -> bool:
    """Java and the Kafka jar cache are there."""
    libs = _libs()
    return _java() is not None and libs.is_dir() and any(libs.glob("kafka_2.13-*.jar"))


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass(frozen=True)
class SecureBroker:
    sasl_bootstrap: str
    mtls_bootstrap: str
    pki: Pki
    dir: Path

    def sasl(self, mechanism: str = "SCRAM-SHA-512", **more: str) -> dict[str, str]:
        return {"security.protocol": "SASL_SSL", "sasl.mechanism": mechanism, "sasl.username": USER,
                "sasl.password": PASSWORD, "ssl.ca.pem": self.pki.ca_pem, **more}

    def least(self, mechanism: str = "SCRAM-SHA-512") -> dict[str, str]:
        """SASL settings of :data:`LEAST` (whatever a test's ACLs deny it)."""
        return {**self.sasl(mechanism), "sasl.username": LEAST, "sasl.password": LEAST_PASSWORD}

    def mtls(self) -> dict[str, str]:
        return {"security.protocol": "SSL", "ssl.ca.pem": self.pki.ca_pem,
                "ssl.certificate.pem": self.pki.client_pem, "ssl.key.pem": self.pki.client_key_encrypted_pem,
                "ssl.key.password": "k3y-pass"}


@contextmanager
def secure_broker_running(d: Path) -> Iterator[SecureBroker]:
    """A broker with its files under the (empty) directory ``d``, ready for clients; stopped on exit.

    Raises:
        RuntimeError: Java or the jar cache is missing, or the broker did not start.
    """
    java, libs = _java(), _libs()
    if java is None or not available():
        raise RuntimeError("no Java or no Kafka jar cache (deploy/local/up fetches it)")
    pki = make_pki(lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048))
    (d / "server-keystore.pem").write_text(pki.server_key_pem + pki.server_pem)
    (d / "ca.pem").write_text(pki.ca_pem)
    sasl_port, ctl_port, internal_port, mtls_port = _free_ports(4)
    jaas = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    plain = f'org.apache.kafka.common.security.plain.PlainLoginModule required user_{USER}="{PASSWORD}";'
    (d / "server.properties").write_text(textwrap.dedent(f"""\
        process.roles=broker,controller
        node.id=1
        controller.quorum.voters=1@127.0.0.1:{ctl_port}
        listeners=SASL_SSL://127.0.0.1:{sasl_port},CONTROLLER://127.0.0.1:{ctl_port},INTERNAL://127.0.0.1:{internal_port},SSL://127.0.0.1:{mtls_port}
        advertised.listeners=SASL_SSL://127.0.0.1:{sasl_port},INTERNAL://127.0.0.1:{internal_port},SSL://127.0.0.1:{mtls_port}
        controller.listener.names=CONTROLLER
        inter.broker.listener.name=INTERNAL
        listener.security.protocol.map=CONTROLLER:PLAINTEXT,INTERNAL:PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL
        log.dirs={d / "data"}
        offsets.topic.replication.factor=1
        offsets.topic.num.partitions=1
        transaction.state.log.replication.factor=1
        transaction.state.log.min.isr=1
        transaction.state.log.num.partitions=1
        share.coordinator.state.topic.replication.factor=1
        share.coordinator.state.topic.min.isr=1
        group.initial.rebalance.delay.ms=0
        auto.create.topics.enable=false
        num.network.threads=1
        num.io.threads=2
        background.threads=1
        log.cleaner.threads=1
        ssl.keystore.type=PEM
        ssl.keystore.location={d / "server-keystore.pem"}
        ssl.truststore.type=PEM
        ssl.truststore.location={d / "ca.pem"}
        listener.name.ssl.ssl.client.auth=required
        sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512
        listener.name.sasl_ssl.plain.sasl.jaas.config={plain}
        listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config={jaas}
        listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config={jaas}
        authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
        allow.everyone.if.no.acl.found=true
        super.users=User:ANONYMOUS;User:{USER}
        """))
    cp = ["-cp", f"{libs}/*"]
    log4j = [f"-Dlog4j2.configurationFile={ROOT / 'deploy' / 'kafka' / 'log4j2.properties'}",
             f"-Dkafka.logs.dir={d / 'logs'}"]
    small = ["-Xms64m", "-Xmx384m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Djava.awt.headless=true"]
    cluster_id = subprocess.run([java, *small, *cp, "kafka.tools.StorageTool", "random-uuid"],
                                capture_output=True, text=True, check=True, timeout=120).stdout.strip()
    subprocess.run([java, *small, *log4j, *cp, "kafka.tools.StorageTool", "format", "-t", cluster_id,
                    "-c", str(d / "server.properties"),
                    "--add-scram", f"SCRAM-SHA-256=[name={USER},password={PASSWORD}]",
                    "--add-scram", f"SCRAM-SHA-512=[name={USER},password={PASSWORD}]",
                    "--add-scram", f"SCRAM-SHA-512=[name={LEAST},password={LEAST_PASSWORD}]"],
                   capture_output=True, text=True, check=True, timeout=120)
    with open(d / "kafka.out", "wb") as out:
        proc = subprocess.Popen([java, *small, *log4j, *cp, "kafka.Kafka", str(d / "server.properties")],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
    broker = SecureBroker(f"127.0.0.1:{sasl_port}", f"127.0.0.1:{mtls_port}", pki, d)
    try:
        if not _ready(broker, proc):
            raise RuntimeError(f"the SASL_SSL broker did not start:\n{(d / 'kafka.out').read_text()[-3000:]}")
        yield broker
    finally:
        stop_process(proc, wait=30)


def _ready(broker: SecureBroker, proc: subprocess.Popen[bytes], timeout: float = 120) -> bool:
    """The SASL listener answers metadata, and the idempotent producer's coordinator is loaded (a
    first producer otherwise logs a transient 'coordinator load in progress' warning)."""
    from confluent_kafka import KafkaException, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    s = Settings.from_env({}, kafka_bootstrap_servers=broker.sasl_bootstrap, kafka_extra=broker.sasl())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            AdminClient(s.admin_config()).list_topics(timeout=2)
            break
        except KafkaException:
            time.sleep(0.5)
    else:
        return False
    admin = AdminClient(s.admin_config())
    admin.create_topics([NewTopic("warm-up", 1, 1)])["warm-up"].result(30)
    p = Producer(s.producer_config())
    p.produce("warm-up", b"x")
    return p.flush(60) == 0
