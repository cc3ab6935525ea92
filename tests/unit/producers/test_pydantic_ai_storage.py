"""A durable agent's conversation is stored once (issue 26, item 1): with the real local artifact store,
an agent with a 20 KB system prompt (or 20 KB of instructions, repeated in every request message)
calling one tool per turn stores at most 0.5 MB of artifacts after 40 model calls, growing linearly
(about 2.6 kB per call here, against 1.8 MB and growing quadratically with the messages stored whole);
a run recorded before the model requests were stored by reference replays without diverging, and a
replay reads the recorded results only."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from runlog.producers import (
    AsyncStageContext,
    DictInputSource,
    LocalArtifactStore,
    Runner,
    Workflow,
    load_args,
)
from runlog.producers.calls._keys import canonical_json, sha256_hex
from runlog.producers.calls._ledger import InMemoryEffectLedger
from runlog.producers.log._memory import InMemoryEventLog, InMemoryLeaseManager, InMemoryLeaseTable
from runlog.producers.pydantic_ai import RunlogAgent
from runlog.schemas import ArtifactRef, EventType
from tests.unit.producers._replay import again, recorded_calls

T = EventType
MODEL = "pydantic_ai.model.long"
PROMPT = "You answer in one word. " * 834  # 20,016 characters


class Long:
    """An agent that calls its tool once per turn until its ``calls``-th model request, then answers."""

    def __init__(self, calls: int, *, prompt: str = "system_prompt") -> None:
        self.calls, self.asked = calls, 0
        agent = Agent(FunctionModel(self.respond), name="long", **{prompt: PROMPT})

        @agent.tool_plain
        def step(n: int) -> dict[str, Any]:
            return {"n": n, "ok": True}

        self.durable = RunlogAgent(agent)

    def respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.asked += 1
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        if turn + 1 >= self.calls:
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[ToolCallPart("step", {"n": turn})])

    def workflow(self) -> Workflow:
        wf = Workflow("long", "1")

        @wf.stage("talk")
        async def talk(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
            result = await self.durable.run(ctx, "go")
            return {"answer": result.output}

        return wf


class Counting(LocalArtifactStore):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.read: list[ArtifactRef] = []

    def get(self, ref: ArtifactRef) -> bytes:
        self.read.append(ref)
        return super().get(ref)


def _runner(store: LocalArtifactStore, log: InMemoryEventLog) -> Runner:
    return Runner(log, InMemoryLeaseManager(InMemoryLeaseTable(), holder="w"), store,
                  source=DictInputSource({}), ledger=InMemoryEffectLedger(), run_log=log)


def _size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _stored(tmp: Path, calls: int, **kw: Any) -> int:
    """Bytes under a fresh artifact root after one run of an agent making ``calls`` model requests."""
    long = Long(calls, **{k: v for k, v in kw.items() if k == "prompt"})
    if kw.get("whole"):  # as before: the messages and tool definitions in every request's arguments
        long.durable.model_tool = dataclasses.replace(long.durable.model_tool, args_by_ref=())
    root, log = tmp / f"{calls}-{sorted(kw.items())}", InMemoryEventLog(writer_id="w")
    runner = _runner(LocalArtifactStore(root), log)
    try:
        res = runner.run(long.workflow(), {})
    finally:
        runner.close()
    assert res.completed and long.asked == calls
    assert sum(e.type is T.TOOL_CALLED and e.tool == MODEL for e in log.events(res.run_id)) == calls
    return _size(root)


@pytest.mark.parametrize("prompt", ["system_prompt", "instructions"])
def test_the_40_call_agent_stores_at_most_half_a_megabyte_growing_linearly(tmp_path: Path,
                                                                         prompt: str) -> None:
    s10, s20, s40 = (_stored(tmp_path, n, prompt=prompt) for n in (10, 20, 40))
    print(f"{prompt}: {s10:,} / {s20:,} / {s40:,} bytes after 10 / 20 / 40 model calls")
    assert s40 <= 500_000
    # linear: 20 more calls cost twice what 10 more did (quadratic growth would cost four times)
    assert 1.6 <= (s40 - s20) / (s20 - s10) <= 2.4
    assert (s40 - s20) / 20 < 5_000  # bytes per call: the new messages, not the conversation


def test_with_the_messages_stored_whole_the_same_agent_stores_megabytes(tmp_path: Path) -> None:
    assert _stored(tmp_path, 40, whole=True) > 1_500_000  # what the test above would catch


def test_a_run_recorded_with_whole_requests_replays_and_a_replay_reads_the_results_only(
        tmp_path: Path) -> None:
    long = Long(12)
    long.durable.model_tool = dataclasses.replace(long.durable.model_tool, args_by_ref=())
    store, log = Counting(tmp_path / "a"), InMemoryEventLog(writer_id="w")
    runner = _runner(store, log)
    try:
        first = runner.run(long.workflow(), {})
        assert first.completed and long.asked == 12
        evs = log.events(first.run_id)
        old = [e for e in evs if e.type is T.TOOL_CALLED and e.tool == MODEL]
        assert all(e.payload_ref is not None and e.payload_ref.media_type == "application/json" for e in old)
        # the same agent on the new code (requests stored by reference): every call is read back, none
        # diverges (the request hashes are over the same full requests), the model is not asked again
        new = Long(12)
        store.read.clear()
        res = again(runner, evs, new.workflow(), {}, recorded_calls=recorded_calls(evs))
        assert res.completed and res.outputs == first.outputs and new.asked == 0
        results = [e.payload_ref for e in evs if e.type is T.TOOL_RESULT]
        assert len(results) == 12 + 11 and sorted(r.sha256 for r in store.read if r is not None) == sorted(
            r.sha256 for r in results if r is not None)  # the recorded results, not the arguments
    finally:
        runner.close()


def test_every_recorded_request_hashes_to_its_request_hash(tmp_path: Path) -> None:
    long = Long(6, prompt="instructions")
    store, log = LocalArtifactStore(tmp_path), InMemoryEventLog(writer_id="w")
    runner = _runner(store, log)
    try:
        res = runner.run(long.workflow(), {})
    finally:
        runner.close()
    for e in log.events(res.run_id):
        if e.type is T.TOOL_CALLED and e.tool == MODEL:
            assert e.payload_ref is not None and e.payload_ref.size < 1_000
            args = load_args(store, e.payload_ref)
            assert sha256_hex(canonical_json(args)) == e.request_hash
            requests = [m for m in args["messages"] if m["kind"] == "request"]
            assert all(m.get("instructions") == PROMPT.strip() for m in requests)
