"""Payload encryption on the real broker and Redis: no planted string readable anywhere after a crashed
and resumed demo run; ``runlog erase`` of one of two subjects (the other resumes and audits clean)."""

from __future__ import annotations

import base64
import json
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from runlog.processors.audit import AuditOptions, audit
from runlog.processors.demo.run import run_demo
from runlog.processors.erase import erase_subject
from runlog.processors.operate import cancel_run
from runlog.processors.schedule import ScheduleBook
from runlog.producers import DictInputSource, Runner, Schedule
from runlog.producers.internal import store_from_settings
from runlog.projections import RunStatus
from runlog.schemas import EventType, RunFailed, Settings
from runlog.schemas.errors import SubjectErased
from tests.integration.resume._toy import Abandon, Toy, failing, toy
from tests.integration.resume._workers import resume_after_crash
from tests.integration.resume.conftest import accepted, log_of

pytestmark = pytest.mark.integration

_DATA_URI = re.compile(rb"data:[^;,\"]*;base64,([A-Za-z0-9+/=]+)")


def _with_inline_decoded(blob: bytes) -> bytes:
    """``blob`` followed by the bytes of every ``data:`` URI in it: an inline payload in clear is base64,
    which a plain grep would miss."""
    extra = [base64.b64decode(m.group(1) + b"=" * (-len(m.group(1)) % 4)) for m in _DATA_URI.finditer(blob)]
    return b"\n".join([blob, *extra])


def dump_everything(settings: Settings, client: redis.Redis) -> bytes:
    """Every record (key, value, headers) of every topic of the test's prefix, every Redis key of its
    prefix (each value read by its type) and every file of the artifact store, inline payloads decoded."""
    out: list[bytes] = []
    names = [t for t in AdminClient(settings.admin_config()).list_topics(timeout=15).topics
             if t.startswith(settings.topic_prefix)]
    assert names, "no topic of the test's prefix"
    c = Consumer({**settings.consumer_config(f"t-dump-{uuid.uuid4().hex[:8]}"), "enable.auto.commit": False})
    try:
        for topic in names:
            meta = c.list_topics(topic, timeout=15).topics[topic]
            for p in meta.partitions:
                low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=15)
                if high <= low:
                    continue
                c.assign([TopicPartition(topic, p, low)])
                got = low
                deadline = time.monotonic() + 30
                while got < high and time.monotonic() < deadline:
                    for msg in c.consume(500, timeout=1.0):
                        if msg.error() is not None:
                            continue
                        got = msg.offset() + 1
                        out += [msg.key() or b"", msg.value() or b""]
                        out += [v or b"" for _, v in (msg.headers() or [])]
                assert got >= high, f"{topic}[{p}]: read to {got} of {high}"
    finally:
        c.close()
    for key in client.scan_iter(match=f"{settings.redis_prefix}*", count=1000):
        kind = client.type(key)
        kind = kind.decode() if isinstance(kind, bytes) else kind
        out.append(key)
        if kind == "string":
            out.append(client.get(key) or b"")
        elif kind == "hash":
            out += [x for kv in client.hgetall(key).items() for x in kv]
        elif kind == "list":
            out += client.lrange(key, 0, -1)
        elif kind == "set":
            out += list(client.smembers(key))
        elif kind == "zset":
            out += [m for m, _ in client.zrange(key, 0, -1, withscores=True)]
        elif kind == "stream":
            out += [x for _, fields in client.xrange(key) for kv in fields.items() for x in kv]
    for dirpath, _, files in os.walk(settings.artifact_root):
        for name in files:
            out.append(Path(dirpath, name).read_bytes())
    return _with_inline_decoded(b"\n".join(x if isinstance(x, bytes) else str(x).encode() for x in out))


@pytest.mark.slow  # the demo: two worker processes, a crash, a resumer (about 45 s on this machine)
def test_with_encryption_on_the_demo_crashes_resumes_and_no_planted_string_is_readable(
        topics: Settings, redis_client: redis.Redis, tmp_path: Path) -> None:
    sealed = topics.with_(encryption=True, keyring=str(tmp_path / "keyring"))
    planted = f"cust-{uuid.uuid4().hex}"
    r = run_demo(sealed, quiet=True, workdir=tmp_path / "demo",
                 params=json.dumps({"seed": 7, "customer": planted}))
    assert r["resume"] == "completed" and r["completed"] is True
    assert r["publishes"] == r["reference"]["publishes"] == 1  # the guarantees hold with encryption on
    assert r["renders_billed"] == r["reference"]["renders_billed"] == 3
    assert r["uploads"] == r["reference"]["uploads"] + 1
    assert r["epochs"] == [1, 2]

    # a control run in clear, in the same namespace: the dump does see parameters, inline refs and artifacts
    control = f"ctl-{uuid.uuid4().hex}"
    t = toy("ctl")
    t.crashing = False
    with Runner.from_settings(topics, source=DictInputSource({})) as runner:
        assert runner.run(t.workflow, {"q": control, "pad": control * 20}).completed

    dump = dump_everything(topics, redis_client)
    assert control.encode() in dump
    assert f"ctl:{control}".upper().encode() in dump  # a tool's result (stage output), inline
    for secret in (planted, "resumable agent workflows", "On resumable agent workflows / cover",
                   "resumable agent workflows: source"):
        assert secret.encode() not in dump, f"{secret!r} is readable"
    # the run's payloads still read with the keyring
    history = log_of(sealed, r["run_id"])
    params_ref = history[-1].state.params_ref
    assert params_ref is not None
    assert json.loads(store_from_settings(sealed).get(params_ref))["customer"] == planted


def _crash_for(settings: Settings, t: Toy, subject: str, q: str) -> str:
    """A run of ``t`` for ``subject``, crashed in its second stage (its lease left to expire)."""
    t.crashing = True
    runner = Runner.from_settings(settings, source=DictInputSource({}))
    try:
        h = runner.start_run(t.workflow, {"q": q}, subject=subject)
        assert h.session is not None
        with pytest.raises(Abandon):
            runner.execute(h.session, release=False)
    finally:
        runner.close()
        t.crashing = False
    return h.run_id


@pytest.mark.slow  # three runs, two whole-topic reads (erase, audit), a resume after a lease expiry
def test_erasing_one_of_two_subjects_blocks_its_runs_and_leaves_the_other_whole(
        topics: Settings, redis_client: redis.Redis, tmp_path: Path) -> None:
    s = topics.with_(encryption=True, keyring=str(tmp_path / "keyring"))
    t = toy("shop")
    alice_secret, bob_secret = f"alice-{uuid.uuid4().hex}", f"bob-{uuid.uuid4().hex}"
    alice = _crash_for(s, t, "cust-alice", alice_secret)
    bob = _crash_for(s, t, "cust-bob", bob_secret)
    with Runner.from_settings(s, source=DictInputSource({})) as runner:  # a finished run of alice too,
        # its stage outputs over the inline limit: stored artifacts, which the erase sweeps
        done = runner.run(t.workflow, {"q": alice_secret + "-2" + "x" * 600}, subject="cust-alice")
    assert done.completed

    res = erase_subject(s, "cust-alice", by="dpo@example.test", reason="deletion request 42")
    assert res.destroyed and set(res.runs) == {alice, done.run_id} and res.blocked == [alice]
    assert res.artifacts_deleted >= 2  # gather's and finish's outputs (and the parameters)
    assert not (tmp_path / "keyring" / "subjects" / f"{res.subject_key}.json").exists()

    # alice's open run ended BLOCKED, reason erased, who and why on the log
    a_log = accepted(log_of(s, alice))
    assert a_log[-1].event.type is EventType.RUN_BLOCKED and a_log[-1].state.status is RunStatus.BLOCKED
    assert a_log[-1].event.attributes["reason"] == "erased"
    assert a_log[-1].event.attributes["by"] == "dpo@example.test"
    # her payloads read nowhere: parameters, stage outputs
    store = store_from_settings(s)
    with pytest.raises(SubjectErased):
        store.get(a_log[-1].state.params_ref)  # type: ignore[arg-type]
    for ref in a_log[-1].state.stage_outputs.values():
        with pytest.raises(SubjectErased):
            store.get(ref)
    # nor can anything more be written for her
    with Runner.from_settings(s, source=DictInputSource({})) as runner, pytest.raises(SubjectErased):
        runner.run(t.workflow, {"q": "again"}, subject="cust-alice")

    # bob's run resumes and completes, reusing his recorded lookup
    outcome = resume_after_crash(s, t.app(), bob)  # once the crashed writer's lease is gone
    assert outcome.result == "completed", outcome
    assert t.calls["lookup"] == 3  # alice, bob, alice's finished run: none again on resume
    b_state = accepted(log_of(s, bob))[-1].state
    assert json.loads(store.get(b_state.params_ref))["q"] == bob_secret  # type: ignore[arg-type]

    # the audit verifies every chain: no finding, alice's runs listed as erased
    report = audit(s, AuditOptions(), progress=None)
    assert report.findings == [], [f.to_dict() for f in report.findings]
    assert sorted(report.erased) == sorted([alice, done.run_id])
    assert bob not in report.erased

    dump = dump_everything(s, redis_client)
    assert alice_secret.encode() not in dump and bob_secret.encode() not in dump


def test_erasing_the_default_subject_finds_the_runs_started_without_one(topics: Settings,
                                                                         tmp_path: Path) -> None:
    """A run started without a subject is sealed under RUNLOG_DEFAULT_SUBJECT's key, but its
    RUN_STARTED did not name it: ``runlog erase --subject default`` destroyed the key and found, blocked
    and listed none of its runs."""
    s = topics.with_(encryption=True, keyring=str(tmp_path / "keyring"), default_subject="tenant-a")
    t = toy("plain")
    t.crashing = False
    with Runner.from_settings(s, source=DictInputSource({})) as runner:
        done = runner.run(t.workflow, {"q": "no subject given"})
    assert done.completed
    assert accepted(log_of(s, done.run_id))[-1].state.subject == "tenant-a"
    res = erase_subject(s, "tenant-a", by="dpo@example.test", reason="tenant left")
    assert res.destroyed and res.runs == [done.run_id]
    report = audit(s, AuditOptions(run_id=done.run_id), progress=None)
    assert report.erased == [done.run_id] and report.findings == [], [f.to_dict() for f in report.findings]


def test_erase_refuses_without_encryption_and_without_who_or_why(topics: Settings, tmp_path: Path) -> None:
    from runlog.processors.operate import OperatorRefused

    with pytest.raises(OperatorRefused, match="encryption is off"):
        erase_subject(topics, "cust-x", by="me", reason="why")
    sealed: Any = topics.with_(encryption=True, keyring=str(tmp_path / "k"))
    with pytest.raises(OperatorRefused, match="--by"):
        erase_subject(sealed, "cust-x", by=" ", reason="why")
    with pytest.raises(OperatorRefused, match="--subject"):
        erase_subject(sealed, " ", by="me", reason="why")


def _plant(settings: Settings, t: Toy, tag: str, subject: str | None) -> dict[str, str]:
    """A failing tool whose message, an operator's cancel reason and a schedule's params each carry a
    string of their own (``tag`` + a random part); the strings by path."""
    strings = {k: f"{tag}-{k}-{uuid.uuid4().hex}" for k in ("error", "reason", "schedule")}
    wf, _ = failing(f"{t.name}fail")
    with Runner.from_settings(settings, source=DictInputSource({})) as runner, \
            pytest.raises((ValueError, RunFailed)):
        runner.run(wf, {"q": strings["error"]}, subject=subject)
    crashed = _crash_for(settings, t, subject or settings.default_subject, f"{tag}-q")
    assert cancel_run(settings, crashed, by="ops@example.test",
                      reason=f"customer {strings['reason']} asked").status == "CANCELLED"
    with ScheduleBook(settings) as book:
        book.put(Schedule(name=f"nightly-{tag}", workflow=t.workflow.name, params={"c": strings["schedule"]},
                          every=3600))
    return strings


def _errors_and_reasons(settings: Settings) -> list[str]:
    """Every error message and reason attribute on the events topic of the test's prefix, as written."""
    from runlog.projections.log_reader import read_topic
    from runlog.schemas import Codec, RunEvent

    codec = Codec.from_settings(settings)
    found: list[str] = []
    for batch in read_topic(settings):
        for msg in batch:
            ev = codec.decode(msg.value(), RunEvent)
            if ev.error is not None:
                found.append(ev.error.message)
            found += [v for k, v in ev.attributes.items() if k in ("reason", "why")]
    return found


@pytest.mark.slow  # two crashed runs, two failing runs, two cancels, two schedules and a whole dump (~25 s)
def test_error_messages_operator_reasons_and_schedule_params_are_sealed(
        topics: Settings, redis_client: redis.Redis, tmp_path: Path) -> None:
    sealed = topics.with_(encryption=True, keyring=str(tmp_path / "keyring"))
    clear = _plant(topics, toy("ctl"), "ctl", None)  # a control in clear: the dump does see these paths
    secret = _plant(sealed, toy("shop"), "sec", "cust-carol")

    dump = dump_everything(topics, redis_client)
    for path, s in clear.items():
        assert s.encode() in dump, f"control {path} not in the dump: the dump misses that path"
    for path, s in secret.items():
        assert s.encode() not in dump, f"the {path} string is readable"

    # still readable with the keyring: the run's error, the operator's reason, the schedule's params
    store = store_from_settings(sealed)
    texts = [store.open_text(t) for t in _errors_and_reasons(sealed)]
    assert any(secret["error"] in t for t in texts)
    assert any(secret["reason"] in t for t in texts)
    redis_client.delete(f"{sealed.redis_prefix}:{{schedules}}", f"{sealed.redis_prefix}:{{schedules}}:synced")
    with ScheduleBook(sealed) as book:  # rebuilt from the topic, opened with the keyring
        assert book.get("nightly-sec").params == {"c": secret["schedule"]}
    # once the subject is erased, its texts read [erased] (its runs had ended: nothing to block)
    erase_subject(sealed, "cust-carol", by="dpo@example.test", reason="deletion request 7")
    texts = [store.open_text(t) for t in _errors_and_reasons(sealed)]
    assert not any(secret["error"] in t or secret["reason"] in t for t in texts)
    assert "[erased]" in texts
