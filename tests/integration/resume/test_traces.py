"""Traces that follow a run, across real OS processes on the real broker and Redis: each process
(``_traced``) exports its spans through OpenTelemetry's in-memory exporter to a JSON file read here.

A run is started with a tracer and SIGKILLed in its second stage (process A); an operator asks for
its resume with ``runlog resume`` (process C); a resumer group member (process B) continues it. The
run is one trace: B's resume span is a child of the run span A recorded in ``RUN_STARTED``, linked
to C's command span; every record of the run carries the context of the span that wrote it; the
resume request carries C's. A projector (process D) folds the topic: its batch spans link to the
contexts of the records they folded. An operator's ``runlog cancel`` is a span its events carry."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Message
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from runlog.processors.demo.run import wait_lease_gone, worker_env
from runlog.processors.resume import Resumer
from runlog.schemas import Codec, EventType, RunEvent, Settings, Topics
from runlog.schemas._tracecontext import TraceContext, from_attributes, from_headers
from tests.conftest import ROOT
from tests.integration.producers.test_cloudevents_headers import records
from tests.integration.resume._traced import app

pytestmark = pytest.mark.integration

MODULE = "tests.integration.resume._traced"
Spans = list[dict[str, Any]]


def traced(settings: Settings, mode: str, spans: Path, *args: str, crash_at: str | None = None,
           ) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", MODULE, mode, str(spans), *args], cwd=ROOT,
                            env=worker_env(settings, "", crash_at), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finished(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return proc.returncode, out, err


def read_spans(path: Path) -> Spans:
    return list(json.loads(path.read_text())) if path.exists() else []


def one(spans: Spans, name: str) -> dict[str, Any]:
    found = [s for s in spans if s["name"] == name]
    assert len(found) == 1, [s["name"] for s in spans]
    return found[0]


def run_records(settings: Settings, run_id: str) -> list[tuple[RunEvent, TraceContext | None]]:
    codec = Codec.from_settings(settings)
    out = []
    for m in records(settings, Topics.of(settings).events):
        if m.key() == run_id.encode():
            out.append((codec.decode(m.value() or b"", RunEvent), from_headers(m.headers())))
    return out


def resume_requests(settings: Settings, run_id: str) -> list[Message]:
    return [m for m in records(settings, Topics.of(settings).resume) if m.key() == run_id.encode()]


def test_a_run_crashed_in_one_process_and_resumed_in_another_is_one_trace(topics: Settings,
                                                                          tmp_path: Path) -> None:
    s = topics.with_(lease_ttl_ms=1500, sweep_interval_ms=0)  # only the operator's request resumes it
    a_spans, b_spans, c_spans, d_spans = (tmp_path / f"{x}.json" for x in "abcd")

    rc, out, err = finished(traced(s, "start", a_spans, crash_at="inside:STAGE:finish"))
    assert rc == -9, err
    run_id = out.split()[0]
    resumer = traced(s, "resumer", b_spans)
    wait_lease_gone(s, run_id, 30)
    rc, out, err = finished(traced(s, "cli", c_spans, "resume", run_id))
    assert rc == 0, err
    rc, out, err = finished(resumer)
    assert rc == 0 and json.loads(out) == ["completed"], err

    a, b, c = read_spans(a_spans), read_spans(b_spans), read_spans(c_spans)
    # A: killed in "finish", its run span never ended; "gather" and its call were exported
    assert not [x for x in a if x["name"].startswith("runlog.run ")]
    gather = one(a, "runlog.stage gather")
    events = run_records(s, run_id)
    started = events[0][0]
    assert started.type is EventType.RUN_STARTED
    run_ctx = from_attributes(started.attributes)  # the run span's context, recorded at the start
    assert run_ctx is not None
    assert (run_ctx.trace_id, run_ctx.span_id) == (gather["trace_id"], gather["parent"])
    # C: the operator's command span
    command = one(c, "runlog resume")
    assert command["attributes"]["runlog.run_id"] == run_id and command["trace_id"] != run_ctx.trace_id
    # B: the resume continues the run's trace, linked to the command that asked for it
    resume = one(b, "runlog.resume")
    assert (resume["trace_id"], resume["parent"]) == (run_ctx.trace_id, run_ctx.span_id)
    assert resume["links"] == [[command["trace_id"], command["span_id"]]]
    assert resume["attributes"]["runlog.outcome"] == "completed"
    run2 = one(b, "runlog.run traced")
    assert (run2["trace_id"], run2["parent"]) == (run_ctx.trace_id, resume["span_id"])
    finish = one(b, "runlog.stage finish")
    assert (finish["trace_id"], finish["parent"]) == (run_ctx.trace_id, run2["span_id"])
    assert {x["trace_id"] for x in a + b} == {run_ctx.trace_id}  # one trace, two processes

    # every record of the run carries the context of the span that wrote it
    writer = {1: run_ctx.span_id}
    for event, ctx in events:
        assert ctx is not None and ctx.trace_id == run_ctx.trace_id, (event.type, ctx)
        if event.epoch == 1:
            assert ctx.span_id == run_ctx.span_id
        elif event.type is EventType.LEASE_ACQUIRED:
            assert ctx.span_id == resume["span_id"]
        else:
            writer[event.epoch] = ctx.span_id
            assert ctx.span_id == run2["span_id"], event.type
    assert events[-1][0].type is EventType.RUN_COMPLETED and sorted(writer) == [1, 2]
    # the resume request carries the operator's context
    (request,) = resume_requests(s, run_id)
    asked = from_headers(request.headers())
    assert asked is not None and (asked.trace_id, asked.span_id) == (command["trace_id"], command["span_id"])
    # a resume that has nothing to do opens no span (here with a provider passed in)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with Resumer(s, app, tracer_provider=provider) as again:
        assert again.resume(run_id).result == "nothing_to_do"
    assert exporter.get_finished_spans() == ()

    # D: a projector's batch spans link to the contexts of the records they folded
    projector = traced(s, "cli", d_spans, "project", "--app-id", "trace-projector")
    want = {(ctx.trace_id, ctx.span_id) for _, ctx in events if ctx is not None}
    deadline = time.monotonic() + 90
    linked: set[tuple[str, str]] = set()
    while time.monotonic() < deadline and not want <= linked:
        time.sleep(0.5)
        linked = {(t, sp) for x in read_spans(d_spans) if x["name"] == "runlog.project"
                  for t, sp in x["links"]}
    projector.send_signal(signal.SIGTERM)
    finished(projector, 60)
    batches = [x for x in read_spans(d_spans) if x["name"] == "runlog.project"]
    assert want == linked, (want, linked)
    assert all(x["kind"] == "CONSUMER" and x["attributes"]["runlog.records"] >= 1 for x in batches)
    assert sum(x["attributes"]["runlog.records"] for x in batches) >= len(events)


def test_an_operator_command_is_a_span_its_events_carry(topics: Settings, tmp_path: Path) -> None:
    s = topics.with_(lease_ttl_ms=1500)
    rc, out, err = finished(traced(s, "start", tmp_path / "a.json", crash_at="inside:STAGE:finish"))
    assert rc == -9, err
    run_id = out.split()[0]
    wait_lease_gone(s, run_id, 30)
    rc, out, err = finished(traced(s, "cli", tmp_path / "c.json", "cancel", run_id, "--by", "ops",
                                   "--reason", "trace test"))
    assert rc == 0, err
    command = one(read_spans(tmp_path / "c.json"), "runlog cancel")
    assert command["parent"] is None and command["attributes"]["runlog.run_id"] == run_id
    by_operator = [(e, ctx) for e, ctx in run_records(s, run_id) if e.epoch == 2]
    assert [e.type for e, _ in by_operator] == [EventType.LEASE_ACQUIRED, EventType.RUN_CANCELLED]
    for _, ctx in by_operator:
        assert ctx is not None and (ctx.trace_id, ctx.span_id) == (command["trace_id"], command["span_id"])


def test_with_tracing_off_an_operator_command_opens_no_span_and_writes_no_context(topics: Settings,
                                                                                  tmp_path: Path) -> None:
    s = topics.with_(lease_ttl_ms=1500)
    rc, out, err = finished(traced(s, "start", tmp_path / "a.json", crash_at="inside:STAGE:finish"))
    assert rc == -9, err
    run_id = out.split()[0]
    wait_lease_gone(s, run_id, 30)
    rc, out, err = finished(traced(s.with_(tracing=False), "cli", tmp_path / "c.json", "cancel", run_id,
                                   "--by", "ops", "--reason", "trace test"))
    assert rc == 0, err
    assert read_spans(tmp_path / "c.json") == []
    by_operator = [(e, ctx) for e, ctx in run_records(s, run_id) if e.epoch == 2]
    assert [e.type for e, _ in by_operator] == [EventType.LEASE_ACQUIRED, EventType.RUN_CANCELLED]
    assert [ctx for _, ctx in by_operator] == [None, None]


def test_an_approval_is_a_span_its_signal_and_resume_request_carry(topics: Settings, tmp_path: Path) -> None:
    from runlog.producers import Runner
    from tests.integration.resume import _ops_app as ops

    with Runner.from_settings(topics, source=ops.app.source) as r:
        waiting = r.run(ops.approvals, {})
    assert waiting.waiting == "approval"
    rc, _, err = finished(traced(topics, "cli", tmp_path / "c.json", "approve", waiting.run_id,
                                 "--by", "ops"))
    assert rc == 0, err
    command = one(read_spans(tmp_path / "c.json"), "runlog approve")
    ctx = (command["trace_id"], command["span_id"])
    by_operator = [(e, c) for e, c in run_records(topics, waiting.run_id) if e.epoch == 2]
    assert [e.type for e, _ in by_operator] == [EventType.LEASE_ACQUIRED, EventType.SIGNAL_RECEIVED]
    assert [(c.trace_id, c.span_id) if c else None for _, c in by_operator] == [ctx, ctx]
    (request,) = resume_requests(topics, waiting.run_id)
    asked = from_headers(request.headers())
    assert asked is not None and (asked.trace_id, asked.span_id) == ctx
