"""The Schema Registry mode against a real registry server and a real broker.

The registry is Apicurio Registry (its Confluent-compatible API, ``/apis/ccompat/v7``) started by
``deploy/local/registry up`` (in-memory storage, 127.0.0.1:18081), or the one named by
``RUNLOG_TEST_SCHEMA_REGISTRY_URL``. When neither can be had, the tests are skipped with the
reason (the ``mock://`` registry paths are in ``tests/unit/schemas/test_registry_mode.py``).

One events topic gets both framings: a run written by a single-object writer and crashed, a run
written whole by a registry writer, and the crashed run resumed by a registry resumer (so one run
holds both). Then every reader reads the topic through the codec it builds from settings: the
projector's batch decode, the audit, the resumer's plan, the rebuild, ``runlog runs``' fold.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
import redis
from confluent_kafka.schema_registry import Schema

from runlog.processors.audit import AuditOptions, audit
from runlog.processors.demo.run import wait_lease_gone
from runlog.processors.inspect import runs_from_log
from runlog.processors.resume import Resumer
from runlog.producers import DictInputSource, Runner
from runlog.projections import RawRecord, RedisStore, RunStatus, decode_records
from runlog.projections.log_reader import read_topic
from runlog.projections.rebuild import rebuild
from runlog.schemas import SINGLE_OBJECT_MAGIC, Codec, Settings, load_schema
from runlog.schemas.registry import registry_client
from tests.conftest import ROOT, require
from tests.integration.resume._toy import crash, toy

pytestmark = pytest.mark.integration

SCRIPT = ROOT / "deploy" / "local" / "registry"


@pytest.fixture(scope="session")
def registry_url() -> Iterator[str]:
    """A real Schema Registry's URL; the registry is stopped again at the end if this started it."""
    given = os.environ.get("RUNLOG_TEST_SCHEMA_REGISTRY_URL")
    if given:
        yield given
        return
    status = subprocess.run([str(SCRIPT), "status"], capture_output=True, timeout=30, check=False)
    was_up = status.returncode == 0
    proc = subprocess.run([str(SCRIPT), "up"], capture_output=True, text=True, timeout=900, check=False)
    require(proc.returncode == 0, f"no Schema Registry server: deploy/local/registry up failed "
            f"({proc.returncode}): {proc.stderr.strip()[-1500:]}")
    url = next((ln.split("=", 1)[1].strip("'\"") for ln in proc.stdout.splitlines()
                if ln.startswith("export RUNLOG_SCHEMA_REGISTRY_URL=")), None)
    assert url, proc.stdout
    try:
        yield url
    finally:
        if not was_up:
            subprocess.run([str(SCRIPT), "down"], capture_output=True, timeout=120, check=False)


def _records(settings: Settings) -> list[RawRecord]:
    """Every record of the events topic, by partition and offset."""
    out = [RawRecord(m.topic(), m.partition(), m.offset(), m.key(), m.value())
           for batch in read_topic(settings) for m in batch]
    return sorted(out, key=lambda r: (r.partition, r.offset))


def test_registry_writers_frame_with_the_registry_and_every_reader_reads_both_framings(
        topics: Settings, registry_url: str) -> None:
    plain = topics
    reg = topics.with_(schema_registry_url=registry_url)
    t = toy(f"reg{uuid.uuid4().hex[:6]}")

    # a run written in single-object encoding, crashed in its second stage
    crashed = crash(plain, t, "a")
    # a run written whole through the registry
    with Runner.from_settings(reg, source=DictInputSource({})) as runner:
        res = runner.run(t.workflow, {"q": "b"})
    assert res.completed
    whole = res.run_id
    # the crashed run planned and resumed through the registry: its tail is registry-framed
    wait_lease_gone(plain, crashed, plain.lease_ttl_ms / 1000 * 4)
    with Resumer(reg, t.app()) as r:
        plan, state = r.plan(crashed)
        assert state.status is RunStatus.RUNNING and plan.blocked_reason is None
        before = plan.events_read
        assert r.resume(crashed).result == "completed"

    # the bytes: registry framing (0x00 + the registry's id of runlog.RunEvent) from registry writers
    client = registry_client(reg)
    current = Schema(json.dumps(load_schema("runlog.RunEvent")), "AVRO")
    sid = client.lookup_schema("runlog.RunEvent", current).schema_id
    expected_head = b"\x00" + int(sid).to_bytes(4, "big")
    recs = _records(reg)
    by_run: dict[bytes, list[RawRecord]] = {}
    for rec in recs:
        by_run.setdefault(rec.key or b"", []).append(rec)
    assert {r.value[:5] for r in by_run[whole.encode()] if r.value} == {expected_head}
    heads = [r.value[:2] for r in by_run[crashed.encode()] if r.value]
    assert heads[:before] == [SINGLE_OBJECT_MAGIC] * before
    assert heads[before:] and {h[:1] for h in heads[before:]} == {b"\x00"}
    assert all(r.value is not None and r.value[:5] == expected_head
               for r in by_run[crashed.encode()][before:])
    n_events = len(recs)

    # the projector's batch decode (BatchProjector.process decodes with it)
    good, dead = decode_records(Codec.from_settings(reg), recs)
    assert dead == [] and len(good) == n_events
    # a reader without the registry still dead-letters registry-framed records (unchanged)
    _, dead_plain = decode_records(Codec.from_settings(plain), recs)
    assert dead_plain and {d.reason for d in dead_plain} == {"unknown_schema"}

    # the audit
    report = audit(reg, AuditOptions(check_artifacts=False), progress=None)
    assert report.undecodable == 0 and report.events == n_events, [f.detail for f in report.findings]
    assert {crashed, whole} <= set(report.runs)
    assert report.findings == [], [(f.kind, f.detail) for f in report.findings]

    # the resumer's plan (read from the log: no projector ran, so no snapshot in Redis)
    with Resumer(reg, t.app()) as r:
        plan, state = r.plan(crashed)
    assert state.status is RunStatus.COMPLETED
    assert plan.events_read == len(by_run[crashed.encode()])

    # the rebuild
    rep = rebuild(reg, progress=None)
    assert rep.dead_letters == 0 and rep.records == n_events and rep.rejected == 0
    client_r = redis.Redis.from_url(reg.redis_url)
    try:
        target = RedisStore(client_r, f"{reg.redis_prefix}:rebuild")
        for run_id in (crashed, whole):
            st = target.load_state(run_id)
            assert st is not None and st.status is RunStatus.COMPLETED
    finally:
        client_r.close()

    # runlog runs' fold of the whole log
    states = runs_from_log(reg)
    assert states[crashed].status is RunStatus.COMPLETED and states[whole].status is RunStatus.COMPLETED


def test_runlog_schemas_register_against_the_real_registry(registry_url: str) -> None:
    env = {**os.environ, "RUNLOG_SCHEMA_REGISTRY_URL": registry_url}
    proc = subprocess.run([sys.executable, "-m", "runlog", "schemas", "register", "--json"],
                          capture_output=True, text=True, timeout=120, check=False, env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert [d["subject"] for d in out] == ["runlog.RunEvent", "runlog.Checkpoint", "runlog.Effect",
                                           "runlog.ResumeRequest", "runlog.StreamRecord",
                                           "runlog.RunSubmission"]
    assert {d["compatibility"] for d in out} == {"BACKWARD"}
    client = registry_client(Settings(schema_registry_url=registry_url))
    for d in out:
        found = client.lookup_schema(d["subject"], Schema(json.dumps(load_schema(d["subject"])), "AVRO"))
        assert (found.schema_id, found.version) == (d["schema_id"], d["version"])
