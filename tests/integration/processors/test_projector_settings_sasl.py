"""The projector and the librdkafka clients against a real SASL_SSL / mutual-TLS Kafka broker.

The module starts its own single-node broker (KRaft) from the jar cache of ``deploy/local/up``
(``.runlog/kafka/libs``): a SASL_SSL listener (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512; SCRAM users
added at format time) and an SSL listener that requires a client certificate, both with a
server certificate from a throw-away CA. It takes about 5 s to start; the module is skipped when
the jars or Java are missing. Redis is the session's normal one.

* the projector (a real ``runlog project`` process) connects over SASL_SSL with the CA given
  inline (``RUNLOG_KAFKA_SSL_CA_PEM``: the projector used to fail CERTIFICATE_VERIFY_FAILED), in
  a group id under the topic prefix;
* Faust's Kafka client connects with the credentials built for every mechanism, and with an
  inline client certificate and encrypted key over mutual TLS; a wrong password is refused;
* librdkafka clients that close cleanly print nothing on stderr.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from cryptography.hazmat.primitives.asymmetric import rsa

from processors.admin import ensure_topics
from processors.projector import faust_credentials
from projections import RedisStore
from schemas import Settings
from tests.conftest import require
from tests.integration.processors.harness import ROOT, produce, start_projector, stop, wait_until
from tests.unit.processors.test_projector_settings import Pki, make_pki
from tests.unit.projections.runlogs import full_run

pytestmark = pytest.mark.integration

USER, PASSWORD = "svc", "svc-secret-" + os.urandom(4).hex()


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

    def mtls(self) -> dict[str, str]:
        return {"security.protocol": "SSL", "ssl.ca.pem": self.pki.ca_pem,
                "ssl.certificate.pem": self.pki.client_pem, "ssl.key.pem": self.pki.client_key_encrypted_pem,
                "ssl.key.password": "k3y-pass"}


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    java, libs = _java(), _libs()
    require(java is not None and libs.is_dir() and any(libs.glob("kafka_2.13-*.jar")),
            "no Java or no Kafka jar cache (deploy/local/up fetches it)")
    assert java is not None
    d = tmp_path_factory.mktemp("secure-kafka")
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
                    "--add-scram", f"SCRAM-SHA-512=[name={USER},password={PASSWORD}]"],
                   capture_output=True, text=True, check=True, timeout=120)
    with open(d / "kafka.out", "wb") as out:
        proc = subprocess.Popen([java, *small, *log4j, *cp, "kafka.Kafka", str(d / "server.properties")],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
    broker = SecureBroker(f"127.0.0.1:{sasl_port}", f"127.0.0.1:{mtls_port}", pki, d)
    try:
        if not _ready(broker, proc):
            pytest.fail(f"the SASL_SSL broker did not start:\n{(d / 'kafka.out').read_text()[-3000:]}")
        yield broker
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


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


def _secure(settings: Settings, bootstrap: str, extra: dict[str, str]) -> Settings:
    return settings.with_(kafka_bootstrap_servers=bootstrap, kafka_extra=extra)


def test_projector_connects_over_sasl_ssl_with_an_inline_ca(
    secure_broker: SecureBroker, settings: Settings, redis_client: redis.Redis, tmp_path: Path
) -> None:
    s = _secure(settings, secure_broker.sasl_bootstrap, secure_broker.sasl("SCRAM-SHA-512"))
    assert all(r.action == "created" for r in ensure_topics(s))
    runs = [full_run(f"sasl-{i}", stages=2) for i in range(3)]
    produce(s, [e for evs in runs for e in evs])
    kafka_env = {k: v for k, v in s.to_env().items() if k.startswith("RUNLOG_KAFKA_")}
    assert "RUNLOG_KAFKA_SSL_CA_PEM" in kafka_env and "RUNLOG_KAFKA_SSL_CA_LOCATION" not in kafka_env
    log = tmp_path / "projector.log"
    proc = start_projector(s, "proj", log=log, **kafka_env)
    store = RedisStore(redis_client, s.redis_prefix)
    want = {evs[0].run_id: len(evs) for evs in runs}

    def projected() -> bool:
        states = store.load_states(want)
        return all(r in states and states[r].last_seq == n for r, n in want.items())

    try:
        assert wait_until(projected, 90, every=0.5), log.read_text()[-4000:]
    finally:
        stop(proc)
    text = log.read_text()
    assert "CERTIFICATE_VERIFY_FAILED" not in text and "SASL authentication error" not in text, text[-3000:]
    # the projector's group id carries the topic prefix, and it committed there
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient

    group = s.group_id("proj")
    assert group == f"{s.topic_prefix}proj"
    admin = AdminClient(s.admin_config())
    got = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(30)
    assert any(tp.offset > 0 for tp in got.topic_partitions)


async def _list_topics(creds: Any, bootstrap: str) -> set[str]:
    from aiokafka import AIOKafkaConsumer
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=15_000,
                         **credentials_to_aiokafka_auth(creds))
    try:
        await c.start()
        return set(await c.topics())
    finally:
        await c.stop()


@pytest.mark.parametrize("how", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "ca-file", "mtls-inline-key"])
def test_faust_client_connects_with_every_mapping(secure_broker: SecureBroker, how: str) -> None:
    if how == "ca-file":
        extra = {**secure_broker.sasl("PLAIN"), "ssl.ca.location": str(secure_broker.dir / "ca.pem")}
        del extra["ssl.ca.pem"]
    elif how == "mtls-inline-key":
        extra = secure_broker.mtls()
    else:
        extra = secure_broker.sasl(how)
    bootstrap = secure_broker.mtls_bootstrap if how.startswith("mtls") else secure_broker.sasl_bootstrap
    creds = faust_credentials(Settings.from_env({}, kafka_bootstrap_servers=bootstrap, kafka_extra=extra))
    assert "warm-up" in asyncio.run(_list_topics(creds, bootstrap))


def test_a_wrong_password_is_refused_by_the_broker(secure_broker: SecureBroker) -> None:
    extra = {**secure_broker.sasl("SCRAM-SHA-256"), "sasl.password": "not-it"}
    creds = faust_credentials(Settings.from_env({}, kafka_extra=extra))
    with pytest.raises(Exception, match=r"(?i)auth|connect"):  # aiokafka's error types vary
        asyncio.run(_list_topics(creds, secure_broker.sasl_bootstrap))


CLIENTS = """
import time
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from schemas import Settings

s = Settings.from_env()
for round in range(3):
    c = Consumer(s.consumer_config("quiet-close"))
    c.subscribe(["warm-up"])
    deadline = time.monotonic() + 20
    while not c.assignment() and time.monotonic() < deadline:
        c.poll(0.2)
    assert c.assignment(), "no assignment"
    c.close()
    c = Consumer(s.consumer_config("quiet-close-read"))
    print(c.get_watermark_offsets(TopicPartition("warm-up", 0), timeout=10))
    c.close()
    c = Consumer(s.consumer_config("quiet-close-now"))
    c.close()
    p = Producer(s.producer_config())
    p.produce("warm-up", b"y")
    assert p.flush(30) == 0
    del p
    AdminClient(s.admin_config()).list_topics(timeout=10)
print("done")
"""


def test_clean_closes_against_the_sasl_broker_print_nothing(secure_broker: SecureBroker) -> None:
    """No authentication-error (or any) line on stderr when librdkafka clients close cleanly; the
    script runs with Python's default logging (warnings and errors of the librdkafka logger would
    still be printed)."""
    s = Settings.from_env({}, kafka_bootstrap_servers=secure_broker.sasl_bootstrap,
                          kafka_extra=secure_broker.sasl("SCRAM-SHA-256"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNLOG_")}
    env.update(s.to_env())
    out = subprocess.run([sys.executable, "-c", CLIENTS], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=180, check=False)
    assert out.returncode == 0 and out.stdout.endswith("done\n"), out.stdout + out.stderr
    assert out.stderr == ""
