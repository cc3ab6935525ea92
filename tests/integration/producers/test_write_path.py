"""The write path against the real broker and Redis: event sequences, effects, keys, failures."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from runlog.producers import CallInfo, LocalArtifactStore, RetryPolicy, Runner, Workflow, rule, tool
from runlog.producers.calls._artifacts import is_inline
from runlog.producers.calls._keys import canonical_json, delivery_key, idempotency_key, sha256_hex
from runlog.producers.log._session import RunSession
from runlog.producers.log._writer import RunWriter
from runlog.producers.run._core import STAGE_OUTPUT_MEDIA_TYPE
from runlog.projections.log_reader import LogReader
from runlog.schemas import Codec, EventType, ReplayPolicy, RunEvent, Settings, Topics
from runlog.schemas.errors import RetryableToolError, RunConflict, TerminalToolError, VerificationFailed
from tests.integration.producers.conftest import SOURCE
from tests.integration.producers.helpers import events_of, read_events

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]
T = EventType


def content_workflow(log: list[str] | None = None) -> Workflow:
    """research, verify, draft, visual (IDEMPOTENT effect), publish (RECONCILE_FIRST)."""
    calls = log if log is not None else []

    @tool("search")
    def search(call: CallInfo, q: str) -> list[str]:
        calls.append(call.call_id)
        return [f"{q}-{i}" for i in range(3)]

    @tool("check", policy=ReplayPolicy.IDEMPOTENT)
    def check(call: CallInfo, claims: list[str]) -> dict[str, Any]:
        calls.append(call.call_id)
        return {"ok": len(claims), "key": call.idempotency_key}

    @tool("upload", policy=ReplayPolicy.IDEMPOTENT, effect=True, target="cdn:images",
          delivery=lambda a, c: ("acct-1", "cdn", f"{c.run_id}/{a['name']}", "1"))
    def upload(call: CallInfo, name: str) -> dict[str, Any]:
        calls.append(call.call_id)
        return {"external_id": f"img-{name}", "epoch": call.epoch}

    @tool("publish", policy=ReplayPolicy.RECONCILE_FIRST, target="platform:articles",
          delivery=lambda a, c: ("acct-1", "blog", a["slug"], a["rev"]), reconcile=lambda k, a: None)
    def publish(call: CallInfo, slug: str, rev: str) -> dict[str, Any]:
        calls.append(call.call_id)
        return {"external_id": f"post-{slug}", "url": f"https://example.invalid/{slug}"}

    wf = Workflow("content", version="1")

    @wf.stage("research", rules=[rule("results.count >= 3", lambda o: len(o["results"]) >= 3)])
    def research(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"results": ctx.call(search, q=ctx.params["topic"])}

    @wf.stage("verify", inputs=["facts"])
    def verify(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return dict(ctx.call(check, claims=inputs["facts"]["claims"]))

    @wf.stage("draft", inputs=["style"], checkpoint=False)
    def draft(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"text": " ".join(ctx.output_of("research")["results"]), "tone": inputs["style"]["tone"]}

    @wf.stage("visual", rules=[rule("image.count == 2", lambda o: len(o["images"]) == 2)])
    def visual(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        cover = ctx.put_artifact(b"\x89PNG cover", "image/png")
        return {"images": [ctx.call(upload, name="cover")["external_id"],
                           ctx.call(upload, name="inline")["external_id"]], "cover": cover.sha256}

    @wf.stage("publish")
    def publish_stage(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return dict(ctx.call(publish, slug="hello", rev="1"))

    return wf


EXPECTED = [
    (T.RUN_STARTED, None, None),
    (T.STAGE_STARTED, "research", None),
    (T.TOOL_CALLED, "research", "research/search/0"),
    (T.TOOL_RESULT, "research", "research/search/0"),
    (T.VERIFIED, "research", None),
    (T.STAGE_STARTED, "verify", None),
    (T.TOOL_CALLED, "verify", "verify/check/0"),
    (T.TOOL_RESULT, "verify", "verify/check/0"),
    (T.VERIFIED, "verify", None),
    (T.STAGE_STARTED, "draft", None),
    (T.VERIFIED, "draft", None),
    (T.STAGE_STARTED, "visual", None),
    (T.TOOL_CALLED, "visual", "visual/upload/0"),
    (T.EFFECT_INTENT, "visual", "visual/upload/0"),
    (T.EFFECT_RESULT, "visual", "visual/upload/0"),
    (T.TOOL_RESULT, "visual", "visual/upload/0"),
    (T.TOOL_CALLED, "visual", "visual/upload/1"),
    (T.EFFECT_INTENT, "visual", "visual/upload/1"),
    (T.EFFECT_RESULT, "visual", "visual/upload/1"),
    (T.TOOL_RESULT, "visual", "visual/upload/1"),
    (T.VERIFIED, "visual", None),
    (T.STAGE_STARTED, "publish", None),
    (T.TOOL_CALLED, "publish", "publish/publish/0"),
    (T.EFFECT_INTENT, "publish", "publish/publish/0"),
    (T.EFFECT_RESULT, "publish", "publish/publish/0"),
    (T.TOOL_RESULT, "publish", "publish/publish/0"),
    (T.VERIFIED, "publish", None),
    (T.RUN_COMPLETED, None, None),
]


def test_five_stage_workflow_produces_exactly_the_expected_sequence(runner: Runner, topics: Settings) -> None:
    wf = content_workflow()
    result = runner.run(wf, {"topic": "kafka"}, inputs={"facts": "v1"})
    reads = events_of(read_events(topics), result.run_id)
    events = [r.event for r in reads]

    assert [(e.type, e.stage, e.call_id) for e in events] == EXPECTED
    assert [e.seq for e in events] == list(range(1, len(EXPECTED) + 1))
    assert {e.epoch for e in events} == {1}
    assert len({r.partition for r in reads}) == 1 and all(r.key == result.run_id.encode() for r in reads)
    assert result.completed and result.last_seq == len(EXPECTED)

    store = LocalArtifactStore(topics.artifact_root)
    started = events[0]
    assert started.workflow == wf.spec()
    assert dict(started.input_versions) == {"facts": "v1", "style": "house-1"}
    assert started.payload_ref is not None
    assert json.loads(store.get(started.payload_ref)) == {"topic": "kafka"}
    assert started.attributes["params_hash"] == sha256_hex(canonical_json({"topic": "kafka"}))
    assert started.attributes["writer"] == runner.writer.writer_id

    by = {(e.type, e.call_id): e for e in events if e.call_id}
    called = by[(T.TOOL_CALLED, "verify/check/0")]
    args_hash = sha256_hex(canonical_json({"claims": ["a", "b"]}))
    assert called.request_hash == args_hash and called.replay_policy is ReplayPolicy.IDEMPOTENT
    assert called.idempotency_key == idempotency_key(result.run_id, "verify", "check", 0, args_hash)
    assert called.payload_ref is not None
    assert json.loads(store.get(called.payload_ref)) == {"claims": ["a", "b"]}
    assert by[(T.TOOL_CALLED, "research/search/0")].idempotency_key is None  # SAFE: no key
    assert result.outputs["verify"] == {"ok": 2, "key": called.idempotency_key}  # the key reached the tool

    intent = by[(T.EFFECT_INTENT, "publish/publish/0")]
    assert intent.delivery_key == delivery_key("acct-1", "blog", "hello", "1")
    assert intent.target == "platform:articles"
    assert intent.request_hash == sha256_hex(canonical_json({"slug": "hello", "rev": "1"}))
    assert intent.replay_policy is ReplayPolicy.RECONCILE_FIRST
    eff = by[(T.EFFECT_RESULT, "publish/publish/0")]
    assert (eff.external_id, eff.delivery_key, eff.target) == ("post-hello", intent.delivery_key,
                                                               "platform:articles")
    res_ref = by[(T.TOOL_RESULT, "publish/publish/0")].payload_ref
    assert res_ref is not None and json.loads(store.get(res_ref))["external_id"] == "post-hello"

    verified = {e.stage: e for e in events if e.type is T.VERIFIED}
    assert [(r.rule, r.passed) for r in verified["research"].verification] == [("results.count >= 3", True)]
    vis = verified["visual"]
    assert vis.payload_ref is not None and vis.payload_ref.media_type == STAGE_OUTPUT_MEDIA_TYPE
    assert json.loads(store.get(vis.payload_ref)) == result.outputs["visual"]
    # small payloads travel in their events (RUNLOG_ARTIFACT_INLINE_BYTES): a checkpoint lists the
    # artifacts that live in the store, the stage output last when it is one of them
    assert not any(is_inline(a) for a in vis.artifact_refs)
    listed = {a.sha256 for a in vis.artifact_refs}
    if is_inline(vis.payload_ref):
        assert vis.payload_ref.sha256 not in listed
    else:
        assert vis.artifact_refs[-1] == vis.payload_ref
    stage_refs = [e.payload_ref for e in events if e.stage == "visual" and e.payload_ref is not None
                  and e.type in (T.TOOL_CALLED, T.TOOL_RESULT)]
    assert len(stage_refs) == 4  # 2 args + 2 results: each inline or listed
    assert all(is_inline(r) or r.sha256 in listed for r in stage_refs)
    for a in (*vis.artifact_refs, *stage_refs):
        store.verify(a)


def test_effect_intent_is_acknowledged_before_the_tool_is_entered(topics: Settings) -> None:
    # A long linger keeps unconfirmed records in the client for a second: only a real
    # confirmation gets the intent onto the broker before the tool looks.
    writer = RunWriter(topics, producer_overrides={"linger.ms": 1000})
    runner = Runner.from_settings(topics, source=SOURCE, writer=writer)
    topic = Topics.of(topics).events
    seen: dict[str, Any] = {}

    def committed_events() -> list[RunEvent]:
        """What a fresh consumer can read *now*: everything below the high watermarks."""
        codec = Codec()
        with LogReader(topics, topic, name="t-probe", stall_s=5) as r:  # a committed record reads at once
            return [codec.decode(m.value(), RunEvent) for m in r.records(r.topic_ranges())]

    @tool("publish", policy=ReplayPolicy.RECONCILE_FIRST, target="platform:articles",
          delivery=lambda a, c: ("acct", "blog", a["slug"], "1"), reconcile=lambda k, a: None)
    def publish(call: CallInfo, slug: str) -> dict[str, Any]:
        seen["call"] = call
        seen["log"] = committed_events()
        return {"external_id": "post-1"}

    wf = Workflow("one", "1")

    @wf.stage("publish")
    def stage(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return dict(ctx.call(publish, slug="s"))

    try:
        result = runner.run(wf, {})
    finally:
        runner.close()
        writer.close()
    call: CallInfo = seen["call"]
    intents = [e for e in seen["log"] if e.type is T.EFFECT_INTENT and e.run_id == result.run_id]
    assert [(e.call_id, e.delivery_key) for e in intents] == [(call.call_id, call.delivery_key)]
    assert call.delivery_key == delivery_key("acct", "blog", "s", "1")
    assert call.epoch == 1 and call.run_id == result.run_id
    assert not [e for e in seen["log"] if e.type is T.EFFECT_RESULT and e.run_id == result.run_id]


def test_run_idempotency_key_yields_one_run_and_refuses_changed_params(runner: Runner,
                                                                     topics: Settings) -> None:
    wf = content_workflow()
    first = runner.start_run(wf, {"topic": "kafka"}, idempotency_key="order-42")
    again = runner.start_run(wf, {"topic": "kafka"}, idempotency_key="order-42")
    assert first.created and first.session is not None
    assert (again.run_id, again.created, again.session) == (first.run_id, False, None)
    with pytest.raises(RunConflict, match="order-42") as info:
        runner.start_run(wf, {"topic": "redis"}, idempotency_key="order-42")
    assert info.value.run_id == first.run_id
    first.session.close()
    starts = [r.event for r in read_events(topics) if r.event.type is T.RUN_STARTED]
    assert [e.run_id for e in starts] == [first.run_id]
    assert starts[0].attributes["run_idempotency_key"] == "order-42"


def test_parallel_calls_get_distinct_call_ids_and_finished_ones_are_reused(runner: Runner,
                                                                         topics: Settings) -> None:
    finished = threading.Barrier(3)
    calls: list[str] = []

    @tool("fetch", policy=ReplayPolicy.IDEMPOTENT)
    def fetch(call: CallInfo, url: str) -> dict[str, Any]:
        calls.append(call.call_id)
        if call.index == 2:
            finished.wait(10)  # the other two have returned
            raise TerminalToolError("connection reset by peer")
        try:
            return {"url": url, "body": url.upper()}
        finally:
            finished.wait(10)

    wf = Workflow("gather", "1")

    @wf.stage("gather")
    def gather(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"pages": ctx.parallel(*[(fetch, {"url": u}) for u in ("a", "b", "c")])}

    h = runner.start_run(wf, {})
    assert h.session is not None
    with pytest.raises(TerminalToolError):
        runner.execute(h.session)
    events = [r.event for r in events_of(read_events(topics), h.run_id)]
    results = {e.call_id: e.payload_ref for e in events if e.type is T.TOOL_RESULT}
    assert sorted(k or "" for k in results) == ["gather/fetch/0", "gather/fetch/1"]
    called = sorted(e.call_id or "" for e in events if e.type is T.TOOL_CALLED)
    assert called == ["gather/fetch/0", "gather/fetch/1", "gather/fetch/2"]
    keys = {e.idempotency_key for e in events if e.type is T.TOOL_CALLED}
    assert len(keys) == 3
    [failed] = [e for e in events if e.type is T.FAILED]
    assert (failed.call_id, failed.error and failed.error.kind) == ("gather/fetch/2", "TerminalToolError")

    # What resume will do: take the lease over and re-run the stage with the recorded results.
    calls.clear()
    finished = threading.Barrier(1)
    s2 = RunSession.take_over(runner.writer, runner.leases, h.run_id, last_seq=events[-1].seq,
                              workflow=wf, input_versions=dict(events[0].input_versions),
                              source=SOURCE, params={}, epoch=1)
    assert s2.epoch == 2

    @tool("fetch", policy=ReplayPolicy.IDEMPOTENT)
    def fetch_ok(call: CallInfo, url: str) -> dict[str, Any]:
        calls.append(call.call_id)
        return {"url": url, "body": url.upper()}

    wf2 = Workflow("gather", "1")
    wf2.stage("gather")(lambda ctx, inputs: {"pages": ctx.parallel(*[(fetch_ok, {"url": u}) for u in "abc"])})
    s2.workflow = wf2
    out = runner.execute(s2, recorded_calls={k: v for k, v in results.items() if k and v})
    assert calls == ["gather/fetch/2"]  # the two finished calls are not called again
    assert [p["body"] for p in out.outputs["gather"]["pages"]] == ["A", "B", "C"]
    tail = [r.event for r in events_of(read_events(topics), h.run_id)][len(events):]
    assert [(e.type, e.call_id, e.epoch) for e in tail] == [
        (T.LEASE_ACQUIRED, None, 2), (T.STAGE_STARTED, None, 2), (T.TOOL_CALLED, "gather/fetch/2", 2),
        (T.TOOL_RESULT, "gather/fetch/2", 2), (T.VERIFIED, None, 2), (T.RUN_COMPLETED, None, 2)]
    assert [e.seq for e in tail] == list(range(events[-1].seq + 1, events[-1].seq + 7))


def test_retryable_errors_are_retried_and_terminal_ones_fail_the_stage(runner: Runner,
                                                                      topics: Settings) -> None:
    attempts: list[int] = []

    @tool("flaky", retry=RetryPolicy(attempts=3, backoff=0.01))
    def flaky(call: CallInfo) -> str:
        attempts.append(call.attempt)
        if call.attempt < 3:
            raise RetryableToolError("503 slow down")
        return "ok"

    @tool("broken", retry=RetryPolicy(attempts=5, backoff=0.01))
    def broken(call: CallInfo) -> str:
        attempts.append(-call.attempt)
        raise ValueError("schema mismatch")  # not a RetryableToolError: terminal

    wf = Workflow("errs", "1")

    @wf.stage("a")
    def a(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"r": ctx.call(flaky)}

    @wf.stage("b")
    def b(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        ctx.call(broken)
        return {}

    with pytest.raises(ValueError, match="schema mismatch"):
        runner.run(wf, {})
    assert attempts == [1, 2, 3, -1]
    events = [r.event for r in read_events(topics)]
    assert [(e.type, e.call_id) for e in events if e.stage == "b"] == [
        (T.STAGE_STARTED, None), (T.TOOL_CALLED, "b/broken/0"), (T.FAILED, "b/broken/0")]
    res = next(e for e in events if e.type is T.TOOL_RESULT)
    assert res.attributes["attempts"] == "3"
    failed = events[-1]
    assert failed.error is not None and (failed.error.kind, failed.error.retryable) == ("ValueError", False)
    assert not any(e.type is T.RUN_COMPLETED for e in events)


def test_failed_rule_and_stage_exception_append_failed(runner: Runner, topics: Settings) -> None:
    wf = Workflow("img", "1")

    @wf.stage("visual", rules=[rule("image.count == 3", lambda o: len(o["images"]) == 3),
                               rule("image.watermark == false", lambda o: o["watermark"] is False)])
    def visual(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"images": [1, 2], "watermark": False}

    with pytest.raises(VerificationFailed, match=r"image\.count == 3"):
        runner.run(wf, {})
    wf2 = Workflow("boom", "1")

    @wf2.stage("s")
    def s(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        raise KeyError("missing field")

    with pytest.raises(KeyError):
        runner.run(wf2, {})
    failed = [r.event for r in read_events(topics) if r.event.type is T.FAILED]
    assert len(failed) == 2
    by_stage = {e.stage: e for e in failed}
    v = by_stage["visual"]
    assert [(r.rule, r.passed) for r in v.verification] == [("image.count == 3", False),
                                                           ("image.watermark == false", True)]
    assert v.error is not None and v.error.kind == "VerificationFailed" and "image.count" in v.error.message
    assert by_stage["s"].error is not None and by_stage["s"].error.kind == "KeyError"
    assert not [r for r in read_events(topics) if r.event.type is T.VERIFIED]


_CRASH_CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    from runlog.schemas import Settings
    from runlog.producers import Runner
    from runlog.producers.crash import arm_from_env
    arm_from_env()
    from tests.integration.producers.conftest import SOURCE
    from tests.integration.producers.test_write_path import content_workflow
    s = Settings.from_env(topic_prefix=sys.argv[2], redis_prefix=sys.argv[3], artifact_root=sys.argv[4],
                          lease_ttl_ms=3000)
    with Runner.from_settings(s, source=SOURCE) as r:
        r.run(content_workflow(), {"topic": "kafka"})
    print("survived")
""")


@pytest.mark.parametrize(("point", "last"), [
    ("after:EFFECT_INTENT:visual/upload/1", (T.EFFECT_INTENT, "visual/upload/1")),
    ("before:EFFECT_RESULT:publish/publish/0", (T.EFFECT_INTENT, "publish/publish/0")),
    ("after:TOOL_RESULT:verify/check/0", (T.TOOL_RESULT, "verify/check/0")),
    ("before:TOOL_CALLED:visual/upload/0", (T.STAGE_STARTED, None)),
    ("inside:STAGE:draft", (T.STAGE_STARTED, None)),
    ("inside:TOOL:visual/upload/1", (T.EFFECT_INTENT, "visual/upload/1")),
])
def test_crash_point_kills_the_writer_where_named(topics: Settings, point: str,
                                                  last: tuple[EventType, str | None]) -> None:
    env = {**os.environ, "RUNLOG_CRASH_AT": point, "KAFKA_BOOTSTRAP_SERVERS": topics.kafka_bootstrap_servers,
           "REDIS_URL": topics.redis_url}
    proc = subprocess.run([sys.executable, "-c", _CRASH_CHILD, str(ROOT), topics.topic_prefix,
                           topics.redis_prefix, topics.artifact_root], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert "survived" not in proc.stdout
    events = [r.event for r in read_events(topics)]
    assert (events[-1].type, events[-1].call_id) == last
    assert events[-1].stage == point.rsplit(":", 1)[1].split("/")[0]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))


def test_reconciled_calls_are_not_made_again(runner: Runner, topics: Settings) -> None:
    log: list[str] = []
    wf = content_workflow(log)
    h = runner.start_run(wf, {"topic": "kafka"})
    assert h.session is not None
    record = {"external_id": "post-hello", "url": "https://example.invalid/hello"}
    out = runner.execute(h.session, from_stage="publish", stage_outputs={"research": {"results": []}},
                         reconciled={"publish/publish/0": record})
    assert log == [] and out.outputs["publish"] == record
    events = [r.event for r in events_of(read_events(topics), h.run_id)]
    assert [(e.type, e.call_id) for e in events] == [
        (T.RUN_STARTED, None), (T.STAGE_STARTED, None), (T.TOOL_RESULT, "publish/publish/0"),
        (T.VERIFIED, None), (T.RUN_COMPLETED, None)]
    res = events[2]
    assert res.attributes["source"] == "reconciled" and res.external_id == "post-hello"
    assert res.payload_ref is not None
    assert json.loads(LocalArtifactStore(topics.artifact_root).get(res.payload_ref)) == record
