"""A streaming durable Pydantic AI agent as a workflow, and the worker process the streaming crash
test kills mid-stream.

Workflow ``agent-talk`` (one ``async def`` stage ``answer``): the agent's ``run_stream`` answers the
prompt; its model is a Pydantic AI ``FunctionModel`` with a stream function (no network) that
yields :data:`CHUNKS`. With ``--kill-after N`` the first model request (of the world: a marker file
says whether it was made) SIGKILLs its process once it has streamed ``N`` chunks and the stream
writer has delivered them.

Run as a worker: ``python -m tests.integration.resume._streaming_agent --dir D [--kill-after N]``
prints ``run_id=<id>`` and executes one run.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage
from pydantic_ai.models.function import AgentInfo, FunctionModel

from runlog.processors.resume import App
from runlog.producers import AsyncRunner, AsyncStageContext, DictInputSource, Workflow
from runlog.producers.crash import kill_self
from runlog.producers.pydantic_ai import RunlogAgent
from runlog.producers.streams import default_stream_writer
from runlog.schemas import Settings
from tests.integration.resume._workers import Worker, spawn_worker

MODEL_TOOL = "pydantic_ai.model.talk"
CHUNKS = [f"token{i} " for i in range(12)]
ANSWER = "".join(CHUNKS)


def talk_app(root: Path, kill_after: int | None = None) -> App:
    """The application on the world under ``root`` (killing mid-stream once when ``kill_after``)."""
    root.mkdir(parents=True, exist_ok=True)
    marker = root / "streamed-once"

    async def stream_fn(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        first = not marker.exists()
        marker.touch()
        for i, chunk in enumerate(CHUNKS):
            if first and kill_after is not None and i == kill_after:
                default_stream_writer(Settings.from_env()).flush(10)  # the partial output is out: die
                kill_self()
            yield chunk
            await asyncio.sleep(0.005)

    durable = RunlogAgent(Agent(FunctionModel(stream_function=stream_fn), name="talk"))
    wf = Workflow("agent-talk", version="1")

    @wf.stage("answer")
    async def answer(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        async with durable.run_stream(ctx, "say the tokens") as result:
            return {"answer": await result.get_output()}

    return App.of([wf], durable.tools(), DictInputSource({}), name="agent-talk")


def spawn(settings: Settings, root: Path, *, kill_after: int | None = None) -> Worker:
    args = ["--dir", str(root)] + ([] if kill_after is None else ["--kill-after", str(kill_after)])
    return spawn_worker("tests.integration.resume._streaming_agent", args, settings)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="run one agent-talk workflow")
    p.add_argument("--dir", required=True)
    p.add_argument("--kill-after", type=int, default=None)
    a = p.parse_args(argv)
    settings = Settings.from_env()
    app = talk_app(Path(a.dir), a.kill_after)
    wf = app.registry.get("agent-talk")

    async def go() -> bool:
        async with AsyncRunner.from_settings(settings, source=app.source) as runner:
            handle = await runner.start_run(wf, {})
            print(f"run_id={handle.run_id}", flush=True)
            assert handle.session is not None
            return (await runner.execute(handle.session)).completed

    completed = asyncio.run(go())
    default_stream_writer(settings).flush(10)
    print(f"completed={completed}", flush=True)
    return 0 if completed else 1


if __name__ == "__main__":
    sys.exit(main())
