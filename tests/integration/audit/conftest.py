"""One topic for the audit tests: clean runs, a crashed-and-resumed run, a still-running run,
and a zombie writer's events. Built once per module (the demo takes a few seconds)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import Producer

from runlog.processors.admin import ensure_topics
from runlog.processors.demo.run import run_demo
from runlog.processors.inspect import run_history
from runlog.producers import CallInfo, Runner, StageContext, Workflow, rule, tool
from runlog.schemas import Codec, EventType, ReplayPolicy, RunEvent, Settings, Topics, event_hash
from tests.conftest import Services, _cleanup, claim


@dataclass
class AuditWorld:
    settings: Settings
    reference_run: str
    crashed_run: str
    clean_runs: list[str]
    running_run: str
    zombie_seqs: list[int]
    demo: dict[str, Any]


def small_workflow() -> tuple[Workflow, list[Any]]:
    @tool("notify", policy=ReplayPolicy.IDEMPOTENT, effect=True, target="mail:outbox",
          delivery=lambda args, call: ("acct-test", "mail", str(args["to"]), "1"))
    def notify(call: CallInfo, to: str) -> Any:
        return {"external_id": f"msg-{to}-{call.idempotency_key[:8] if call.idempotency_key else ''}"}

    wf = Workflow("notify", version="1")

    @wf.stage("compose", rules=[rule("text.nonempty", lambda out: bool(out["text"]))])
    def compose(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"text": f"hello {ctx.params['to']}"}

    @wf.stage("send", rules=[rule("sent", lambda out: bool(out["external_id"]))])
    def send(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return ctx.call(notify, to=str(ctx.params["to"]))  # type: ignore[no-any-return]

    return wf, [notify]


def _zombie(settings: Settings, run_id: str) -> list[int]:
    """Events a fenced writer (epoch 1) sends after the resumer took the run over at epoch 2."""
    history = run_history(settings, run_id)
    old = [h.event for h in history if h.event.epoch == 1]
    last = old[-1]
    prev = event_hash(last)
    p = Producer(settings.producer_config())
    codec = Codec()
    seqs = []
    for i, (t, extra) in enumerate([(EventType.EFFECT_RESULT, {"external_id": "zombie-asset"}),
                                    (EventType.TOOL_RESULT, {})]):
        ev = RunEvent(run_id, last.seq + 1 + i, 1, t, last.occurred_at + 1 + i, stage="visual",
                      call_id="visual/upload/5", tool="upload", delivery_key=last.delivery_key,
                      prev_hash=prev, **extra)
        prev = event_hash(ev)
        p.produce(Topics.of(settings).events, key=run_id.encode(), value=codec.encode(ev))
        seqs.append(ev.seq)
    assert p.flush(30) == 0
    return seqs


@pytest.fixture(scope="package")
def audit_world(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuditWorld]:
    tid = uuid.uuid4().hex[:10]
    base = tmp_path_factory.mktemp("audit")
    s = Settings.from_env(
        {}, kafka_bootstrap_servers=services.kafka_bootstrap_servers, redis_url=services.redis_url,
        topic_prefix=f"t{tid}.", redis_prefix=f"t{tid}", partitions=12,
        artifact_root=str(base / "artifacts"), lease_ttl_ms=3000, metrics_port=0,
        artifact_inline_bytes=0,  # every payload a file: the artifact checks have something to find tampered
    )
    claim(s)  # the session's last check counts what is left in it
    try:
        ensure_topics(s)
        demo = run_demo(s, workdir=base / "demo", quiet=True)
        assert demo["completed"], demo
        wf, _tools = small_workflow()
        clean = []
        with Runner.from_settings(s) as runner:
            for to in ("ada", "grace"):
                res = runner.run(wf, {"to": to})
                assert res.completed
                clean.append(res.run_id)
            h = runner.start_run(wf, {"to": "linus"})
            assert h.session is not None
            h.session.append(EventType.STAGE_STARTED, stage="send")
            h.session.append(EventType.EFFECT_INTENT, confirm=True, stage="send", tool="notify",
                             call_id="send/notify/0", delivery_key="ab" * 32, target="mail:outbox",
                             replay_policy=ReplayPolicy.IDEMPOTENT)
            h.session.close(release=True)
        zombie = _zombie(s, demo["run_id"])
        yield AuditWorld(s, demo["reference"]["run_id"], demo["run_id"], clean, h.run_id, zombie, demo)
    finally:
        _cleanup(s)
