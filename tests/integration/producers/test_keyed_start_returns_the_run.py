"""Starting with an idempotency key whose run exists gives that run back, on the real broker and
Redis: its outputs once it completed, its outcome awaited while another process executes it, and a
RunConflict for other parameters under the same key."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from runlog import DictInputSource, RunConflict, Runner, RunResult, Workflow, tool
from runlog.schemas import Settings

pytestmark = pytest.mark.integration


def _flow(calls: list[str], pause: threading.Event | None = None) -> Workflow:
    @tool("stamp")
    def stamp(call: Any, order: str) -> dict[str, Any]:
        calls.append(order)
        return {"stamped": order}

    wf = Workflow("keyed-outcome", "1")

    @wf.stage("stamp")
    def first(ctx: Any, inputs: Any) -> dict[str, Any]:
        return ctx.call(stamp, order=ctx.params["order"])

    @wf.stage("wait")
    def second(ctx: Any, inputs: Any) -> dict[str, Any]:
        if pause is not None:
            assert pause.wait(60)
        return {"done": True}

    return wf


def test_a_second_start_with_the_key_returns_the_completed_runs_outputs(topics: Settings) -> None:
    calls: list[str] = []
    key = f"order-{uuid.uuid4().hex[:8]}"
    with Runner.from_settings(topics, source=DictInputSource({})) as runner:
        first = runner.run(_flow(calls), {"order": "o-1"}, idempotency_key=key)
        again = runner.run(_flow(calls), {"order": "o-1"}, idempotency_key=key)
        handle = runner.start_run(_flow(calls), {"order": "o-1"}, idempotency_key=key)
        with pytest.raises(RunConflict, match="params"):
            runner.run(_flow(calls), {"order": "o-2"}, idempotency_key=key)
    assert first.completed and again.completed and calls == ["o-1"]
    assert again.run_id == first.run_id
    assert again.outputs == {"stamp": {"stamped": "o-1"}, "wait": {"done": True}}
    assert not handle.created and handle.result(timeout=30).outputs == first.outputs


def test_a_start_while_another_process_executes_the_run_waits_for_its_outcome(topics: Settings) -> None:
    calls: list[str] = []
    key = f"order-{uuid.uuid4().hex[:8]}"
    pause = threading.Event()
    results: dict[str, RunResult] = {}

    def execute() -> None:
        with Runner.from_settings(topics, source=DictInputSource({})) as owner:
            results["owner"] = owner.run(_flow(calls, pause), {"order": "o-9"}, idempotency_key=key)

    owner = threading.Thread(target=execute)
    owner.start()
    try:
        deadline = time.monotonic() + 30
        while not calls and time.monotonic() < deadline:
            time.sleep(0.05)
        assert calls == ["o-9"]
        with Runner.from_settings(topics, source=DictInputSource({})) as other:
            handle = other.start_run(_flow(calls), {"order": "o-9"}, idempotency_key=key)
            assert not handle.created and handle.session is None
            with pytest.raises(TimeoutError):
                handle.result(timeout=0.5)  # the owner holds it in its second stage
            threading.Timer(0.5, pause.set).start()
            waited = handle.result(timeout=60)
    finally:
        pause.set()
        owner.join(60)
    assert waited.completed and waited.outputs == results["owner"].outputs and calls == ["o-9"]
