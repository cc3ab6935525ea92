"""Streaming with a durable Pydantic AI agent: a streaming model request is one recorded call whose
result is the whole response, its events go to the streams topic while it runs (here a producer
that keeps what it is given), and a recorded request is read back without streaming again."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from pydantic_ai import Agent
from pydantic_ai.exceptions import ModelServerError
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel

from runlog.producers import AsyncStageContext, RetryPolicy, Workflow
from runlog.producers.log._metrics import WriterMetrics
from runlog.producers.pydantic_ai import RunlogAgent
from runlog.producers.streams import StreamWriter
from runlog.schemas import Codec, EventType, StreamKind, StreamRecord
from tests.unit.producers._replay import MemoryWorld

MODEL = "pydantic_ai.model.talk"
CHUNKS = ["Hel", "lo ", "wor", "ld"]


class KeptProducer:
    """A producer that keeps what it is given (``full``: refuses it, as a full local queue does)."""

    def __init__(self) -> None:
        self.values: list[tuple[bytes, bytes]] = []
        self.full = False

    def produce(self, topic: str, key: bytes, value: bytes, on_delivery: Any = None) -> None:
        if self.full:
            raise BufferError("queue full")
        self.values.append((key, value))

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        return 0


class Stream:
    def __init__(self) -> None:
        self.producer = KeptProducer()
        self.codec = Codec()
        self.writer = StreamWriter(self.producer, self.codec, "runlog.streams")  # type: ignore[arg-type]

    def records(self) -> list[StreamRecord]:
        return [self.codec.decode(v, StreamRecord) for _, v in self.producer.values]


@pytest.fixture
def world() -> Iterator[MemoryWorld]:
    w = MemoryWorld()
    yield w
    w.runner.close()


def talker(stream: Stream, *, fail_first: int = 0,
           retry: RetryPolicy | None = None) -> RunlogAgent[None, str]:
    asked: list[int] = []

    async def stream_fn(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        asked.append(1)
        for i, chunk in enumerate(CHUNKS):
            if len(asked) <= fail_first and i == 2:
                raise ModelServerError("talk", "overloaded mid-stream")
            yield chunk

    agent = Agent(FunctionModel(stream_function=stream_fn), name="talk")
    return RunlogAgent(agent, stream=stream.writer, model_retry=retry)


def workflow(durable: RunlogAgent[None, str], how: str, seen: list[str]) -> Workflow:
    wf = Workflow("talk", "1")

    @wf.stage("answer")
    async def answer(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        if how == "run_stream":
            async with durable.run_stream(ctx, "hi") as result:
                async for text in result.stream_text(delta=True):
                    seen.append(text)
                return {"answer": await result.get_output()}

        async def handler(ctx_: Any, events: Any) -> None:
            async for event in events:
                seen.append(type(event).__name__)

        out = await durable.run(ctx, "hi", event_stream_handler=handler)
        return {"answer": out.output}

    return wf


@pytest.mark.parametrize("how", ["run_stream", "event_stream_handler"])
def test_a_streamed_request_is_one_recorded_call_and_its_deltas_are_stream_records(
        world: MemoryWorld, how: str) -> None:
    stream = Stream()
    seen: list[str] = []
    wf = workflow(talker(stream), how, seen)
    res = world.runner.run(wf, {})
    assert res.completed and res.outputs == {"answer": {"answer": "Hello world"}}
    evs = world.events(res.run_id)
    assert [e.tool for e in evs if e.type is EventType.TOOL_RESULT] == [MODEL]  # one recorded call
    recs = stream.records()
    D, E = StreamKind.DELTA, StreamKind.EVENT  # the model's events as they came: text deltas, others
    assert [r.kind for r in recs] == [StreamKind.BEGIN, D, E, D, D, D, E, StreamKind.FINAL]
    assert [r.text for r in recs if r.kind is D] == CHUNKS and {r.part for r in recs if r.kind is D} == {0}
    assert ['"final_result"' in (r.data or "") for r in recs if r.kind is E] == [True, False]
    assert [r.index for r in recs] == list(range(8))
    ids = {(r.run_id, r.call_id, r.epoch, r.attempt) for r in recs}
    assert ids == {(res.run_id, f"answer/{MODEL}/0", 1, 1)}
    assert all(k == res.run_id.encode() for k, _ in stream.producer.values)  # keyed by run id
    assert '"Hello world"' in (recs[-1].data or "")
    assert seen  # the agent's own consumers got the recorded response's events
    # re-executed with the recorded call: read back, not streamed again, the same output
    n = len(recs)
    again = world.again(res.run_id, wf, {}, recorded_calls=world.recorded(res.run_id))
    assert again.completed and again.outputs == res.outputs
    assert len(stream.records()) == n


def test_a_retried_attempt_supersedes_the_partial_output_of_the_failed_one(world: MemoryWorld) -> None:
    stream = Stream()
    wf = workflow(talker(stream, fail_first=1, retry=RetryPolicy(attempts=2, backoff=0.0)), "run_stream", [])
    res = world.runner.run(wf, {})
    assert res.completed and res.outputs == {"answer": {"answer": "Hello world"}}
    recs = stream.records()
    first = [r for r in recs if r.attempt == 1]
    assert [r.text for r in first if r.kind is StreamKind.DELTA] == CHUNKS[:2]
    assert StreamKind.FINAL not in {r.kind for r in first}
    second = [r for r in recs if r.attempt == 2]
    assert second[0].kind is StreamKind.SUPERSEDED and second[0].call_id == first[0].call_id
    assert [r.text for r in second if r.kind is StreamKind.DELTA] == CHUNKS
    assert second[-1].kind is StreamKind.FINAL


def test_a_full_queue_drops_stream_records_without_failing_the_call(world: MemoryWorld) -> None:
    stream = Stream()
    stream.producer.full = True
    res = world.runner.run(workflow(talker(stream), "run_stream", []), {})
    assert res.completed and res.outputs == {"answer": {"answer": "Hello world"}}
    assert stream.writer.dropped == 8 and stream.writer.produced == 0


def test_iter_with_node_stream_streams_a_recorded_request(world: MemoryWorld) -> None:
    stream = Stream()
    durable = talker(stream)
    wf = Workflow("talk", "1")
    texts: list[str] = []

    @wf.stage("answer")
    async def answer(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        async with durable.iter(ctx, "hi") as run:
            async for node in run:
                if Agent.is_model_request_node(node):
                    async with node.stream(run.ctx) as events:
                        async for text in events.stream_text(delta=True):
                            texts.append(text)
            assert run.result is not None
            return {"answer": run.result.output}

    res = asyncio.run(asyncio.to_thread(world.runner.run, wf, {}))
    assert res.completed and res.outputs == {"answer": {"answer": "Hello world"}}
    assert "".join(texts) == "Hello world"
    assert [r.text for r in stream.records() if r.kind is StreamKind.DELTA] == CHUNKS


def tool_talker(stream: Stream) -> RunlogAgent[None, str]:
    """An agent whose first streamed response asks for ``lookup``, and whose second answers."""

    async def stream_fn(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        if len(messages) == 1:
            yield {0: DeltaToolCall(name="lookup", json_args='{"city": "Oslo"}', tool_call_id="t1")}
        else:
            for chunk in CHUNKS:
                yield chunk

    def fn(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:  # the same, not streamed
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("lookup", '{"city": "Oslo"}', "t1")])
        return ModelResponse(parts=[TextPart("".join(CHUNKS))])

    agent = Agent(FunctionModel(fn, stream_function=stream_fn), name="talk")

    @agent.tool_plain
    def lookup(city: str) -> str:
        return f"sunny in {city}"

    return RunlogAgent(agent, stream=stream.writer)


@pytest.mark.parametrize("how", ["run_stream", "event_stream_handler"])
def test_a_streaming_runs_tool_calls_stream_their_call_and_recorded_result(world: MemoryWorld,
                                                                           how: str) -> None:
    stream = Stream()
    wf = workflow(tool_talker(stream), how, [])
    res = world.runner.run(wf, {})
    assert res.completed and res.outputs == {"answer": {"answer": "Hello world"}}
    tool_id = "answer/pydantic_ai.tool.talk.lookup/1"
    recs = [r for r in stream.records() if r.call_id == tool_id]
    assert [r.kind for r in recs] == [StreamKind.BEGIN, StreamKind.EVENT, StreamKind.FINAL]
    call = json.loads(recs[1].data or "")
    assert call["event_kind"] == "function_tool_call"
    assert (call["part"]["tool_name"], call["part"]["args"], call["part"]["tool_call_id"]) == (
        "lookup", {"city": "Oslo"}, "t1")
    assert "sunny in Oslo" in (recs[2].data or "")
    # the tool call sits between the two model requests, in the order they were made
    calls = [r.call_id for r in stream.records() if r.kind is StreamKind.BEGIN]
    assert calls == [f"answer/{MODEL}/0", tool_id, f"answer/{MODEL}/2"]
    n = len(stream.records())  # replayed from the log: nothing streams again
    again = world.again(res.run_id, wf, {}, recorded_calls=world.recorded(res.run_id))
    assert again.completed and len(stream.records()) == n


def test_a_run_that_does_not_stream_streams_no_tool_call(world: MemoryWorld) -> None:
    stream = Stream()
    durable = tool_talker(stream)
    wf = Workflow("talk", "1")

    @wf.stage("answer")
    async def answer(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"answer": (await durable.run(ctx, "hi")).output}

    res = world.runner.run(wf, {})
    assert res.completed and res.outputs == {"answer": {"answer": "Hello world"}}
    assert stream.records() == []


def test_stream_records_count_in_the_run_writers_metrics() -> None:
    registry = CollectorRegistry()
    metrics = WriterMetrics.of(registry)
    stream = Stream()
    stream.writer.count_in(metrics)
    a = stream.writer.begin(run_id="r", stage="s", call_id="c", epoch=1, attempt=1, supersedes=False)
    a.delta(0, "x")
    stream.producer.full = True
    a.final("{}")

    def value(outcome: str) -> float | None:
        return registry.get_sample_value("runlog_writer_stream_records_total", {"outcome": outcome})

    assert (value("produced"), value("dropped")) == (2.0, 1.0)
    assert (stream.writer.produced, stream.writer.dropped) == (2, 1)
