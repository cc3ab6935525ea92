"""An outside consumer opens sealed payloads with the JDK's own AES-GCM, given the data key: a Java program
(``java/EnvelopeConsumer.java``, the Kafka Java client from the jars deploy/ fetches, no Runlog code)
reads a run's records from the real events topic and the artifact store and prints what it opened."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest

from runlog.producers import DictInputSource, Runner
from runlog.producers.internal import subject_keys
from runlog.schemas import Settings, Topics
from tests.conftest import require
from tests.integration._secure_broker import _java, _libs, available
from tests.integration.resume._toy import toy

pytestmark = pytest.mark.integration
SOURCE = Path(__file__).with_name("java") / "EnvelopeConsumer.java"


def _consume(settings: Settings, run_id: str, key: bytes) -> list[str]:
    proc = subprocess.run([str(_java()), "-cp", f"{_libs()}/*", str(SOURCE), settings.kafka_bootstrap_servers,
                           Topics.of(settings).events, run_id, key.hex(), settings.artifact_root],
                          capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()


@pytest.mark.slow  # two JVM launches compiling the source, each reading the whole events topic (~60 s here)
def test_a_java_consumer_opens_inline_and_stored_payloads_with_the_data_key(topics: Settings,
                                                                             tmp_path: Path) -> None:
    require(available(), "no Java or no Kafka jar cache (deploy/local/up fetches them)")
    s = topics.with_(encryption=True, keyring=str(tmp_path / "keyring"))
    planted = f"java-{uuid.uuid4().hex}"
    t = toy("jv")
    t.crashing = False
    with Runner.from_settings(s, source=DictInputSource({})) as runner:
        run = runner.run(t.workflow, {"q": planted, "pad": "x" * 2000}, subject="cust-java")
    assert run.completed
    keys = subject_keys(s)
    lines = _consume(s, run.run_id, keys.export("cust-java"))
    inline = [json.loads(x.removeprefix("inline ")) for x in lines if x.startswith("inline ")]
    stored = [json.loads(x.removeprefix("stored ")) for x in lines if x.startswith("stored ")]
    assert {"q": planted} in inline  # the lookup's arguments, inline in TOOL_CALLED
    assert {"answer": f"jv:{planted}"} in inline  # its result
    assert {"q": planted, "pad": "x" * 2000} in stored  # the run's parameters: too big to go inline
    # another subject's key opens none of them (GCM authenticates under the key)
    keys.for_subject("cust-other")
    assert _consume(s, run.run_id, keys.export("cust-other")) == []
