"""The projector and the librdkafka clients against a real SASL_SSL / mutual-TLS Kafka broker.

The broker is the session's ``secure_broker`` (:mod:`tests.integration._secure_broker`: a
single-node KRaft broker from the jar cache of ``deploy/local/up`` with a SASL_SSL listener and a
mutual-TLS one); the tests are skipped when the jars or Java are missing. Redis is the session's
normal one.

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
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from runlog.processors.admin import ensure_topics
from runlog.processors.projector import faust_credentials
from runlog.projections import RedisStore
from runlog.schemas import Settings
from tests.integration._secure_broker import SecureBroker
from tests.integration.processors.harness import ROOT, produce, start_projector, stop, wait_until
from tests.unit.projections.runlogs import full_run

pytestmark = pytest.mark.integration


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
from runlog.schemas import Settings

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
