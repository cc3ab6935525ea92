"""The resumer consumer group: requests from the resume topic, the sweeper, the dead-letter topic."""

from __future__ import annotations

import dataclasses
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from runlog.processors.resume import ResumeOutcome, ResumerService, request_resume
from runlog.projections import RunStatus
from runlog.schemas import DecodeError, EventType, Settings, Topics
from tests.integration.resume.conftest import DemoWorld, crash_runs, log_of, project, types_of

pytestmark = pytest.mark.integration


Letter = tuple[bytes, dict[str, bytes]]


def _dead_letters(settings: Settings, expect: int, timeout: float = 20) -> list[Letter]:
    topic = Topics.of(settings).dlq
    c = Consumer(settings.consumer_config(f"t-dlq-{uuid.uuid4().hex[:8]}"))
    out: list[Letter] = []
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        deadline = time.monotonic() + timeout
        while len(out) < expect and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None or m.error() is not None:
                continue
            out.append((m.key(), dict(m.headers() or [])))
    finally:
        c.close()
    return out


def _until(service: ResumerService, done: list[ResumeOutcome], n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while len(done) < n and time.monotonic() < deadline:
        service.poll_once(0.5)
    assert len(done) >= n, f"only {len(done)} of {n} resumes in {timeout}s"


def test_resumer_group_resumes_requests_sweeps_dead_runs_and_dead_letters_junk(
        topics: Settings, world: DemoWorld, tmp_path: Path) -> None:
    s = topics.with_(resumer_group=f"t-resumer-{uuid.uuid4().hex[:8]}", sweep_interval_ms=0)
    requested, swept = crash_runs(s, world, ["inside:STAGE:draft", "inside:STAGE:visual"], tmp_path)
    resume_topic = Topics.of(s).resume
    p = Producer(s.producer_config())
    # same key as the real request: same partition, consumed before it
    p.produce(resume_topic, key=requested.encode(), value=b"\x00not a resume request")
    p.produce(resume_topic, key=b"run-nobody", value=b"")
    assert p.flush(30) == 0
    request_resume(s, requested, "test", requested_by="test")
    request_resume(s, "run-nobody-knows", "test", requested_by="test")

    done: list[ResumeOutcome] = []
    app = world.app()
    with ResumerService(s, app, on_outcome=done.append) as service:
        _until(service, done, 1)
        assert [(o.run_id, o.result) for o in done] == [(requested, "completed")]
        assert types_of(log_of(s, requested))[-1] is EventType.RUN_COMPLETED

        # the sweeper: a run whose worker is alive is left alone, a dead one is requested
        from runlog.producers import Runner

        # its lease outlives any pause of this process under a loaded host: "alive" is what the
        # sweep must see (with the 3 s ttl, a heartbeat thread starved for 3 s while project()
        # folded the topic let the lease expire, and the sweep rightly requested the run)
        with Runner.from_settings(s.with_(lease_ttl_ms=30_000), source=app.source) as runner:
            alive = runner.start_run(app.registry.get("content"), {"seed": 7})
            assert alive.session is not None
            project(s)
            assert set(service.projection.runs(RunStatus.RUNNING)) == {swept, alive.run_id}
            report = service.sweep()
            assert report.requested == [swept]
            assert report.alive == 1
            _until(service, done, 2)
            alive.session.close(release=True)
        assert (done[1].run_id, done[1].result) == (swept, "completed")
        # the resumer did not stop at the junk: the DLQ holds it with a reason
        deadline = time.monotonic() + 15
        letters = _dead_letters(s, 3, timeout=1)
        while len(letters) < 3 and time.monotonic() < deadline:
            service.poll_once(0.5)
            letters = _dead_letters(s, 3, timeout=1)

    reasons = sorted(h["runlog.error.reason"].decode() for _, h in letters)
    assert len(letters) == 3, letters
    by_key = {k: h["runlog.error.reason"].decode() for k, h in letters}
    assert by_key[b"run-nobody-knows"] == "unknown_run"
    assert by_key[requested.encode()] in DecodeError.REASONS
    assert by_key[b"run-nobody"] in DecodeError.REASONS
    assert len(reasons) == 3
    assert all(h["runlog.original.topic"].decode() == resume_topic for _, h in letters)
    stats = world.stats()
    assert stats["publishes"] == 2 and stats["research_calls"] == 2 and stats["renders_billed"] == 6


def test_the_sweep_reads_the_projections_index_only_when_the_namespace_is_ready(
        topics: Settings, world: DemoWorld) -> None:
    """Issue 24, item 5: during a swap (or a rebuild, or a replay) the indexes may list a run under an
    old status; the sweep then sweeps the writers' active set only."""
    from runlog.projections import RedisStore
    from runlog.projections._marker import READY, REBUILDING, marker_key
    from tests.unit.projections.runlogs import WORKFLOW, RunBuilder
    from tests.unit.projections.store_contract import fold_updates

    s = topics.with_(resumer_group=f"t-resumer-{uuid.uuid4().hex[:8]}", sweep_interval_ms=0)
    app = world.app()
    name = sorted(app.registry.names())[0]
    b = RunBuilder("run-indexed-running").start(dataclasses.replace(WORKFLOW, name=name))
    with ResumerService(s, app) as service:
        store = RedisStore(service.redis, s.redis_prefix)
        store.apply(fold_updates(b.events))  # listed RUNNING, no lease, not in the active set
        assert service.projection.runs(RunStatus.RUNNING) == ["run-indexed-running"]
        service.redis.hset(marker_key(s.redis_prefix), "state", REBUILDING)  # a swap midway
        assert service.sweep().requested == []
        service.redis.hset(marker_key(s.redis_prefix), "state", READY)
        assert service.sweep().requested == ["run-indexed-running"]
