"""What a long agent conversation costs to record: log plus artifact bytes against model calls.

A durable Pydantic AI agent (``RunlogAgent``, the ``pydantic-ai`` extra) whose context is a 200 KB
system prompt calls one tool per turn until its ``N``-th model request, with Pydantic AI's
``FunctionModel`` (no network), on the sync :class:`~runlog.producers.Runner` against the bench's broker,
Redis and a fresh local artifact store. Three runs, of ``N / 4``, ``N / 2`` and ``N`` model calls,
each measured after it completed: the run's records on the events topic (key and value bytes, what
the broker stores before compression) plus every file under its artifact root.

Stored whole, every model request's recorded arguments would hold the whole conversation, and the
bytes would grow with the square of the calls; stored by reference (each message once, the
arguments naming them by hash) they grow by a constant per call. ``conversation_growth_ratio``
compares the bytes per call of the second half with those of the second quarter (1.0: linear, 2.0:
quadratic); ``conversation_mb_200`` is the total for 200 model calls (measured at ``--size full``,
extrapolated from the bytes per call below it).
"""

from __future__ import annotations

import contextlib
import importlib.util
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from runlog.processors.bench._env import BenchEnv, end_offsets
from runlog.schemas.errors import RunlogError
from runlog.schemas.settings import Settings
from runlog.schemas.topics import Topics

__all__ = ["CONTEXT_BYTES", "bench_conversation", "conversation_figures", "unavailable"]

Tick = Callable[[str], None]
CONTEXT_BYTES = 200_000
"""The agent's context: its system prompt."""
EXTRA = "the conversation section needs Pydantic AI: pip install 'runlog[pydantic-ai]'"


def unavailable() -> str | None:
    """Why the section cannot run here (the ``pydantic-ai`` extra is not installed), or None.

    Looked up, not imported: importing pydantic-ai takes seconds of CPU, which every ``runlog bench``
    paid before it even asked the broker (with Kafka down, before its one line)."""
    return EXTRA if importlib.util.find_spec("pydantic_ai") is None else None


def _workflow(calls: int) -> tuple[Any, list[int]]:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.usage import UsageLimits

    from runlog.producers import AsyncStageContext, Workflow
    from runlog.producers.pydantic_ai import RunlogAgent

    asked: list[int] = []

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        asked.append(turn)
        if turn + 1 >= calls:
            return ModelResponse(parts=[TextPart(f"done after {turn} tool calls")])
        return ModelResponse(parts=[ToolCallPart("lookup", {"page": turn})])

    line = "Reference material the agent keeps in its context for the whole run. "
    agent = Agent(FunctionModel(respond), name="bench",
                  system_prompt=(line * (CONTEXT_BYTES // len(line) + 1))[:CONTEXT_BYTES])

    @agent.tool_plain
    def lookup(page: int) -> dict[str, Any]:
        return {"page": page, "summary": f"page {page}: nothing new"}

    durable = RunlogAgent(agent)
    wf = Workflow("bench-conversation", "1")

    @wf.stage("talk")
    async def talk(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        result = await durable.run(ctx, "read the material, one page per turn",
                                   usage_limits=UsageLimits(request_limit=None))  # 50 by default
        return {"answer": result.output}

    return wf, asked


def _log_bytes(settings: Settings, run_id: str) -> tuple[int, int, int]:
    """Key + value bytes, number and largest value of the run's records on the events topic."""
    topic = Topics.of(settings).events
    c = Consumer(settings.consumer_config("bench-conversation"))
    total = n = largest = 0
    try:
        ends = end_offsets(c, topic)
        todo = {p for p, end in ends.items() if end > 0}
        c.assign([TopicPartition(topic, p, 0) for p in todo])
        deadline = time.monotonic() + 60
        while todo and time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            if msg.key() == run_id.encode():
                total += len(msg.key() or b"") + len(msg.value() or b"")
                largest = max(largest, len(msg.value() or b""))
                n += 1
            if msg.offset() + 1 >= ends[msg.partition()]:
                todo.discard(msg.partition())
        if todo:
            raise RunlogError(f"bench: the events of {run_id} were not read back within 60 s")
    finally:
        with contextlib.suppress(RuntimeError):
            c.close()
    return total, n, largest


def _one(env: BenchEnv, settings: Settings, calls: int) -> dict[str, Any]:
    from runlog.producers import DictInputSource, Runner

    root = Path(env.workdir) / f"conversation-{calls}"
    s = settings.with_(artifact_root=str(root))
    wf, asked = _workflow(calls)
    t0 = time.perf_counter()
    with Runner.from_settings(s, source=DictInputSource({})) as runner:
        res = runner.run(wf, params={})
    seconds = time.perf_counter() - t0
    if not res.completed or len(asked) != calls:
        raise RunlogError(f"bench: the {calls}-call conversation did not complete ({len(asked)} model calls)")
    files = [p for p in root.rglob("*") if p.is_file()]
    artifacts = sum(p.stat().st_size for p in files)
    log, events, largest = _log_bytes(s, res.run_id)
    # the largest record is the stage's VERIFIED: it lists every artifact the stage stored
    return {"model_calls": calls, "events": events, "log_bytes": log, "largest_event_bytes": largest,
            "artifact_bytes": artifacts,
            "artifact_files": len(files), "total_bytes": log + artifacts, "seconds": seconds,
            "ms_per_model_call": seconds * 1000 / calls}


def conversation_figures(points: list[dict[str, Any]]) -> dict[str, float]:
    """Bytes per call, growth ratio and the total for 200 calls from the runs at N/4, N/2 and N calls."""
    q, h, n = sorted(points, key=lambda p: p["model_calls"])
    per_call = (n["total_bytes"] - h["total_bytes"]) / (n["model_calls"] - h["model_calls"])
    before = (h["total_bytes"] - q["total_bytes"]) / (h["model_calls"] - q["model_calls"])
    at_200 = n["total_bytes"] + (200 - n["model_calls"]) * per_call
    return {"conversation_kb_per_call": per_call / 1000,
            "conversation_growth_ratio": per_call / before if before > 0 else float("nan"),
            "conversation_mb_200": at_200 / 1e6}


def bench_conversation(env: BenchEnv, *, calls: int, tick: Tick) -> dict[str, Any]:
    """Log and artifact bytes of an agent with a 200 KB context after ``calls // 4``, ``calls // 2``
    and ``calls`` model calls (one tool call each but the last).

    Raises:
        RunlogError: a run did not complete, or its events could not be read back.
    """
    s = env.settings("conversation")
    points = []
    for n in (max(calls // 4, 2), max(calls // 2, 3), calls):
        points.append(_one(env, s, n))
        tick(f"conversation: {n} model calls")
    return {**conversation_figures(points), "context_bytes": CONTEXT_BYTES,
            "measured_at_200": calls == 200, "points": points}
