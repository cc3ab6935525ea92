"""`runlog init` and `runlog doctor` against the real broker and Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from runlog.processors.admin import ensure_topics, inspect_topic
from runlog.schemas import Settings, Topics

pytestmark = pytest.mark.integration


def runlog(s: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": s.kafka_bootstrap_servers,
           "REDIS_URL": s.redis_url, "RUNLOG_TOPIC_PREFIX": s.topic_prefix,
           "RUNLOG_REDIS_PREFIX": s.redis_prefix,
           **({"RUNLOG_SCHEMA_REGISTRY_URL": s.schema_registry_url} if s.schema_registry_url else {})}
    return subprocess.run([sys.executable, "-m", "runlog", *args], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_init_twice_leaves_topics_unchanged(settings: Settings) -> None:
    first = runlog(settings, "init", "--json")
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    assert {t["action"] for t in out["topics"]} == {"created"}
    admin = AdminClient(settings.admin_config())
    before = {t: inspect_topic(admin, t) for t in (x["topic"] for x in out["topics"])}
    second = runlog(settings, "init", "--json")
    assert second.returncode == 0, second.stderr
    assert {t["action"] for t in json.loads(second.stdout)["topics"]} == {"ok"}
    after = {t: inspect_topic(admin, t) for t in before}
    for name in before:
        assert (before[name].partitions, before[name].config) == \
            (after[name].partitions, after[name].config)
    events = before[Topics.of(settings).events]
    assert events.partitions == 12 and events.config["cleanup.policy"] == "delete"
    assert before[Topics.of(settings).effects].config["cleanup.policy"] == "compact"


def test_conflicting_topic_gets_a_clear_message(settings: Settings) -> None:
    admin = AdminClient(settings.admin_config())
    name = Topics.of(settings).checkpoints
    admin.create_topics([NewTopic(name, num_partitions=3, replication_factor=1,
                                  config={"cleanup.policy": "delete"})])[name].result(30)
    proc = runlog(settings, "init")
    assert proc.returncode == 1
    assert f"conflict  {name}" in proc.stdout
    assert "cleanup.policy: is 'delete', Runlog needs 'compact'" in proc.stdout
    assert "partitions: is '3', Runlog needs '12'" in proc.stdout
    reports = {r.name: r for r in ensure_topics(settings)}
    assert reports[name].action == "conflict"
    assert inspect_topic(admin, name).config["cleanup.policy"] == "delete"  # left untouched


def test_doctor_reports_services_and_missing_topics(settings: Settings) -> None:
    proc = runlog(settings, "doctor", "--json")
    assert proc.returncode == 1  # topics missing
    out = json.loads(proc.stdout)
    assert out["kafka"]["cluster_id"]
    assert out["redis"]["redis_version"]
    assert {t["action"] for t in out["topics"]} == {"missing"}
    assert runlog(settings, "init").returncode == 0
    proc = runlog(settings, "doctor")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "doctor: all good" in proc.stdout


def test_doctor_exits_3_when_kafka_is_unreachable(settings: Settings) -> None:
    dead = settings.with_(kafka_bootstrap_servers="127.0.0.1:1")
    env_proc = runlog(dead, "doctor", "--json")
    assert env_proc.returncode == 3
    assert "error" in json.loads(env_proc.stdout)["kafka"]


def test_doctor_and_demo_refuse_a_schema_registry_that_does_not_answer(settings: Settings) -> None:
    """Issue 29: doctor said "all good" (exit 0) and demo exited 1 with a worker's traceback, while
    every reader and writer refuses to start without the registry."""
    assert runlog(settings, "init").returncode == 0
    dead = settings.with_(schema_registry_url="http://127.0.0.1:1")
    proc = runlog(dead, "doctor")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "registry http://127.0.0.1:1: ERROR" in proc.stdout and "doctor: problems found" in proc.stdout
    assert "unreachable" in json.loads(runlog(dead, "doctor", "--json").stdout)["registry"]["error"]
    demo = runlog(dead, "demo")
    assert demo.returncode == 2, demo.stderr
    lines = demo.stderr.strip().splitlines()
    assert len(lines) == 1 and "schema registry" in lines[0] and "unreachable" in lines[0]
