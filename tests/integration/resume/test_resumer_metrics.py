"""The resumer's Prometheus endpoint after real resumes on the real broker and Redis: requests, outcomes,
dead letters, the sweep, and the appends of the resumer's own writer, scraped over HTTP."""

from __future__ import annotations

import time
import urllib.request
import uuid

import pytest
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from runlog.processors.demo.run import wait_lease_gone
from runlog.processors.resume import ResumerService, request_resume
from runlog.schemas import EventType, Settings, Topics
from tests.integration.resume._toy import crash, toy, wait_events_topic_ready
from tests.integration.resume.conftest import log_of

pytestmark = pytest.mark.integration

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def _v(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _by(samples: Samples, name: str, label: str) -> dict[str, float]:
    return {dict(lbl)[label]: v for (n, lbl), v in samples.items() if n == name and v}


def _poll_until(service: ResumerService, requests: float, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    reg = service.metrics.registry
    while (reg.get_sample_value("runlog_resumer_requests_total") or 0) < requests:
        assert time.monotonic() < deadline, f"handled {reg.get_sample_value('runlog_resumer_requests_total')}"
        service.poll_once(0.5)


def test_resumer_metrics_count_outcomes_dead_letters_sweeps_and_its_writers_appends(topics: Settings) -> None:
    s = topics.with_(resumer_group=f"t-resumer-{uuid.uuid4().hex[:8]}", sweep_interval_ms=0)
    wait_events_topic_ready(s)
    alpha, beta = toy("alpha"), toy("beta")
    mine, theirs = crash(s, alpha, q="a1"), crash(s, beta, q="b1")
    for run_id in (mine, theirs):
        wait_lease_gone(s, run_id, s.lease_ttl_ms / 1000 * 4)
    p = Producer(s.producer_config())
    p.produce(Topics.of(s).resume, key=b"junk", value=b"\x00not a resume request")
    assert p.flush(30) == 0
    for run_id in (mine, theirs, "run-nobody-knows"):
        request_resume(s, run_id, "test", requested_by="test")

    with ResumerService(s, alpha.app(), metrics_port=0) as service:
        assert service.metrics_server is not None
        port = service.metrics_server.port
        _poll_until(service, 4)
        assert [(o.run_id, o.result) for o in service.outcomes] == [(mine, "completed")]

        # the sweep finds a second crashed run of this App (its lease is gone) and requests it
        swept = crash(s, alpha, q="a2")
        wait_lease_gone(s, swept, s.lease_ttl_ms / 1000 * 4)
        report = service.sweep()
        assert report.requested == [swept]
        _poll_until(service, 5)
        assert [(o.run_id, o.result) for o in service.outcomes] == [(mine, "completed"), (swept, "completed")]
        samples = _scrape(port)
    with pytest.raises(OSError):  # closed with the service
        _scrape(port)

    assert _v(samples, "runlog_resumer_requests_total") == 5
    assert _by(samples, "runlog_resumer_resumes_total", "outcome") == \
        {"completed": 2, "not_mine": 1, "unknown_run": 1}
    assert _v(samples, "runlog_resumer_resume_seconds_count") == 4
    assert _v(samples, "runlog_resumer_resume_seconds_sum") > 0
    letters = _by(samples, "runlog_resumer_dead_letters_total", "reason")
    assert letters.pop("unknown_run") == 1 and sum(letters.values()) == 1, letters  # + the junk's reason
    assert _v(samples, "runlog_resumer_sweeps_total") == 1
    assert _by(samples, "runlog_resumer_sweep_requested_total", "reason") == {"lease_expired": 1}
    assert _v(samples, "runlog_resumer_retries_total") == 0

    # the resumer's writer: every event the two resumes appended, each LEASE_ACQUIRED confirmed (sync)
    resumed = {o.run_id: o.epoch for o in service.outcomes}
    appended = [le.event for run_id, epoch in resumed.items() for le in log_of(s, run_id)
                if le.event.epoch == epoch]
    assert {e.type for e in appended} >= {EventType.LEASE_ACQUIRED, EventType.RUN_COMPLETED}
    confirmed = [e for e in appended if e.type is EventType.LEASE_ACQUIRED]
    assert len(confirmed) == 2
    assert _v(samples, "runlog_writer_appends_total") == len(appended)
    assert _v(samples, "runlog_writer_confirmed_append_seconds_count", mode="sync") == len(confirmed)
    assert _v(samples, "runlog_writer_confirmed_append_seconds_count", mode="async") == 0
    assert _v(samples, "runlog_writer_delivery_failures_total") == 0


def test_runlog_resumer_serves_metrics_on_the_port_it_is_given(topics: Settings) -> None:
    import os
    import subprocess
    import sys

    from runlog.processors.demo.run import worker_env

    env = {**worker_env(topics, "http://127.0.0.1:9"), "RUNLOG_RESUMER_GROUP": f"g-{uuid.uuid4().hex[:8]}"}
    proc = subprocess.Popen([sys.executable, "-m", "runlog", "resumer", "--app",
                             "runlog.processors.demo.pipeline:app", "--idle-exit", "20",
                             "--metrics-port", "0"],
                            env=env, cwd=os.getcwd(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stderr is not None
        port = None
        deadline = time.monotonic() + 60
        while port is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if "metrics on port" in line:
                port = int(line.rsplit(" ", 1)[1])
        assert port, "the resumer did not say where its metrics are"
        samples = _scrape(port)
        assert ("runlog_resumer_requests_total", ()) in samples
        assert ("runlog_writer_appends_total", ()) in samples  # its own writer counts into the registry
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
