"""Usage recorded once, on the real broker and Redis: two durable Pydantic AI agents whose model
responses say what they used (tests/integration/resume/_usage_agent.py, no network).

A run SIGKILLed right after its third model call's result was logged and resumed by a resumer
has the uncrashed run's totals, in the projection, in ``runlog show --json`` and ``runlog runs
--json``; a branch starts from its parent's totals at the fork, kept apart from its own; a
rebuild of the projection from the log gives the same totals; costs come from the App's price
table and the model without a price has tokens and no cost; the projector's Prometheus counters
count each recorded call once (a redelivered log adds nothing).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from runlog.processors.branch import branch_run
from runlog.processors.cli import main
from runlog.processors.inspect import run_history
from runlog.processors.metrics import ProjectorMetrics
from runlog.processors.operate import retry_run
from runlog.producers import PriceTable
from runlog.projections import BatchProjector, RawRecord, RedisStore, RunState
from runlog.projections._usage import UsageTotals
from runlog.projections.log_reader import read_topic
from runlog.schemas import Codec, EventType, Settings, Usage
from runlog.schemas._redis import redis_client
from tests.integration.resume._toy import wait_events_topic_ready
from tests.integration.resume._usage_agent import (
    FAIL_AT,
    FREE,
    PRICED,
    PRICES,
    RESEARCH_MODEL,
    WORKFLOW,
    WRITE_USAGE,
    research_usage,
    usage_app,
)
from tests.integration.resume._workers import finish, resume_after_crash, spawn_worker

pytestmark = [pytest.mark.integration]

T = EventType


def _expected() -> tuple[UsageTotals, UsageTotals]:
    """(research, write) totals of one run, priced here from the table, not read from the log."""
    table = PriceTable(PRICES)
    research = UsageTotals()
    for turn in range(4):
        u = research_usage(turn)
        research = research.add(table.priced(Usage(PRICED, u.input_tokens, u.output_tokens,
                                                    u.cache_read_tokens)))
    write = UsageTotals().add(table.priced(Usage(FREE, WRITE_USAGE.input_tokens, WRITE_USAGE.output_tokens)))
    return research, write


def _project(settings: Settings, metrics: ProjectorMetrics, prefix: str | None = None) -> int:
    """Fold the whole events topic into Redis as the projector does, counting into ``metrics``."""
    store = RedisStore.from_settings(settings) if prefix is None else \
        RedisStore(redis_client(settings), prefix)
    proj = BatchProjector(store, Codec())
    n = 0
    for batch in read_topic(settings):
        recs = [RawRecord(m.topic(), m.partition(), m.offset(), m.key(), m.value()) for m in batch]
        res = proj.process(recs)
        metrics.observe_batch(res, len(batch))
        n += len(batch)
    return n


def _states(settings: Settings, *run_ids: str, prefix: str | None = None) -> dict[str, RunState]:
    store = RedisStore(redis_client(settings), prefix or settings.redis_prefix)
    try:
        return store.load_states(list(run_ids))
    finally:
        store.client.close()


def _worker(settings: Settings, tmp: Path, name: str, crash_at: str | None = None,
            env: dict[str, str] | None = None) -> tuple[int, str]:
    rc, out = finish(spawn_worker("tests.integration.resume._usage_agent", [], settings, crash_at=crash_at,
                                  env=env), tmp / f"{name}.log")
    return rc, next(line.split("=", 1)[1] for line in out.splitlines() if line.startswith("run_id="))


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    capsys.readouterr()
    assert main(list(args)) == 0
    return json.loads(capsys.readouterr().out)


def _sample(m: ProjectorMetrics, name: str, **labels: str) -> float:
    return m.registry.get_sample_value(name, {"workflow": WORKFLOW, **labels}) or 0.0


def test_usage_is_counted_once_across_a_crash_a_resume_a_branch_and_a_rebuild(
        topics: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    settings = topics.with_(lease_ttl_ms=1000)
    for k, v in settings.to_env().items():
        monkeypatch.setenv(k, v)
    wait_events_topic_ready(settings)
    research, write = _expected()
    whole = research.plus(write)
    assert research.cost_nanos and research.unpriced_calls == 0  # the table prices "priced" ...
    assert write.cost_nanos is None and write.unpriced_calls == 1 and write.input_tokens == 500  # not "free"

    rc, ref_id = _worker(settings, tmp_path, "reference")
    assert rc == 0
    ref_events = [le.event for le in run_history(settings, ref_id) if le.outcome.accepted]
    model_calls = [e.call_id for e in ref_events if e.type is T.TOOL_CALLED and e.tool == RESEARCH_MODEL]
    assert len(model_calls) == 4
    third = f"after:TOOL_RESULT:{model_calls[2]}"
    rc, run_id = _worker(settings, tmp_path, "crashed", crash_at=third)
    assert rc == -9  # killed right after its third model call's result was logged

    metrics = ProjectorMetrics(CollectorRegistry())
    _project(settings, metrics)
    crashed = _states(settings, run_id)[run_id]
    assert crashed.usage.calls == 3 and crashed.status.value == "RUNNING"
    assert resume_after_crash(settings, usage_app(), run_id).result == "completed"
    _project(settings, metrics)
    states = _states(settings, ref_id, run_id)
    for s in states.values():  # the resumed run spent what the uncrashed one did, counted once
        assert s.usage == whole and s.total_usage == whole and s.inherited_usage is None
        assert s.stage_usage == {"research": research, "write": write}
        assert s.model_usage == {PRICED: research, FREE: write}
    model_results = [le.event for le in run_history(settings, run_id)
                     if le.outcome.accepted and le.event.type is T.TOOL_RESULT and le.event.usage]
    assert len(model_results) == 5  # three before the crash, two after: none recorded twice

    shown = _cli(capsys, "show", run_id, "--json")
    assert shown["usage"]["total"] == whole.to_dict() and shown["usage"]["inherited"] is None
    assert shown["usage"]["models"][FREE]["cost_usd"] is None and shown["usage"]["models"][FREE]["calls"] == 1
    assert shown["usage"]["stages"]["research"]["cost_nanos"] == research.cost_nanos
    listed = {d["run_id"]: d for d in _cli(capsys, "runs", "--json")}
    assert listed[run_id]["usage"]["total"] == listed[ref_id]["usage"]["total"] == whole.to_dict()
    capsys.readouterr()
    assert main(["runs"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[-2:] == ["tokens", "cost"]
    row = next(line for line in table if line.startswith(run_id)).split()
    cost = f"${whole.cost_nanos / 1e9:.4f}+?"  # "+?": the calls of "free" have no price
    assert row[-2:] == [f"{whole.tokens:,}", cost] and cost == "$0.0092+?"

    branch = branch_run(settings, usage_app(), ref_id, {"style": "v2"})
    assert branch.completed and branch.inherited_stages == ("research",)
    _project(settings, metrics)
    b = _states(settings, branch.run_id)[branch.run_id]
    assert b.inherited_usage == research  # the parent's totals at the fork (after research) ...
    assert b.usage == write and b.stage_usage == {"write": write}  # ... apart from its own
    assert b.total_usage == whole
    shown_branch = _cli(capsys, "show", branch.run_id, "--json")["usage"]
    assert shown_branch["inherited"] == research.to_dict() and shown_branch["own"] == write.to_dict()
    capsys.readouterr()
    assert main(["show", branch.run_id]) == 0
    text = capsys.readouterr().out
    assert f"inherited from {ref_id}" in text and f"this branch: {write.describe()}" in text

    # Prometheus, per workflow and model: each recorded call once (reference, resumed, branch) ...
    assert _sample(metrics, "runlog_model_calls_total", model=PRICED) == 8
    assert _sample(metrics, "runlog_model_calls_total", model=FREE) == 3
    assert _sample(metrics, "runlog_model_tokens_total", model=PRICED, kind="input") == \
        2 * research.input_tokens
    assert _sample(metrics, "runlog_model_tokens_total", model=FREE, kind="output") == 3 * write.output_tokens
    assert _sample(metrics, "runlog_model_cost_usd_total", model=PRICED) == pytest.approx(
        2 * research.cost_nanos / 1e9)
    assert _sample(metrics, "runlog_model_cost_usd_total", model=FREE) == 0
    _project(settings, metrics)  # ... and a redelivered log adds nothing
    assert _sample(metrics, "runlog_model_calls_total", model=PRICED) == 8

    # the projection rebuilt from the log holds the same totals
    target = f"{settings.redis_prefix}:rebuilt"
    rebuilt = _cli(capsys, "projections", "rebuild", "--target", target, "--json")
    assert rebuilt["applied"] > 0
    live = _states(settings, ref_id, run_id, branch.run_id)
    again = _states(settings, ref_id, run_id, branch.run_id, prefix=target)
    for rid, s in live.items():
        a = again[rid]
        assert (a.usage, a.stage_usage, a.model_usage, a.inherited_usage) == \
            (s.usage, s.stage_usage, s.model_usage, s.inherited_usage), rid


def test_a_failed_run_retried_by_an_operator_counts_its_recorded_calls_once(
        topics: Settings, tmp_path: Path) -> None:
    """``runlog retry`` runs the failed stage again: the three model calls recorded before the
    failure are handed back (not spent again), the failed one is asked again, once."""
    wait_events_topic_ready(topics)
    research, write = _expected()
    rc, run_id = _worker(topics, tmp_path, "failing", env={FAIL_AT: "3"})
    assert rc != 0
    failed = [le.state for le in run_history(topics, run_id)][-1]
    assert failed.status.value == "FAILED" and failed.usage.calls == 3
    assert retry_run(topics, usage_app(), run_id, by="ops", force=True, reason="model back").result == \
        "completed"
    history = run_history(topics, run_id)
    state = history[-1].state
    assert state.usage == research.plus(write) and state.stage_usage == {"research": research, "write": write}
    assert sum(1 for le in history if le.outcome.accepted and le.event.usage is not None) == 5
