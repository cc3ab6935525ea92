"""A workflow of two durable Pydantic AI agents whose model responses say what they used, and the
worker process a test kills after a chosen model call.

Workflow ``usage-agent`` (two ``async def`` stages):

* ``research``: agent ``researcher`` on model ``priced`` (a ``FunctionModel``, no network) looks
  three things up one after the other: four model requests, three tool calls;
* ``write`` (reads input ``style``): agent ``writer`` on model ``free`` answers in one request.

Every response carries a ``RequestUsage`` that depends only on its turn (:func:`research_usage`,
:data:`WRITE_USAGE`). The App's price table prices ``priced`` and not ``free``.

Run as a worker: ``python -m tests.integration.resume._usage_agent`` prints ``run_id=<id>`` and
executes one run (with ``RUNLOG_CRASH_AT`` it SIGKILLs itself at that point; with
``USAGE_AGENT_FAIL_AT_TURN=N`` the research model fails at turn N and the run is ``FAILED``).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

from runlog.processors.resume import App
from runlog.producers import AsyncStageContext, DictInputSource, Price, Runner, Workflow
from runlog.producers.crash import arm_from_env
from runlog.producers.pydantic_ai import RunlogAgent
from runlog.schemas import Settings

WORKFLOW = "usage-agent"
RESEARCH_MODEL = "pydantic_ai.model.researcher"
PRICED, FREE = "function:priced", "function:free"
PRICES = {"priced": Price(input="2", output="8", cache_read="0.5")}
"""US dollars per million tokens; ``free`` has no price."""
WRITE_USAGE = RequestUsage(input_tokens=500, output_tokens=200)
FAIL_AT = "USAGE_AGENT_FAIL_AT_TURN"
"""Environment variable: the research model raises at this turn (the run's call fails: FAILED)."""


def research_usage(turn: int) -> RequestUsage:
    return RequestUsage(input_tokens=1000 + 100 * turn, output_tokens=40 + turn,
                        cache_read_tokens=300 if turn else 0)


def _research(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    turn = sum(isinstance(m, ModelResponse) for m in messages)
    if os.environ.get(FAIL_AT) == str(turn):
        raise RuntimeError(f"the model is down at turn {turn}")
    done = sum(isinstance(p, ToolReturnPart) for m in messages for p in m.parts)
    part = ToolCallPart("lookup", {"n": done}) if done < 3 else TextPart(f"found {done} facts")
    return ModelResponse(parts=[part], usage=research_usage(turn))


def _write(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    return ModelResponse(parts=[TextPart("a draft")], usage=WRITE_USAGE)


def usage_app() -> App:
    researcher = Agent(FunctionModel(_research, model_name="priced"), name="researcher")

    @researcher.tool_plain
    def lookup(n: int) -> dict[str, int]:
        return {"fact": n * n}

    writer = Agent(FunctionModel(_write, model_name="free"), name="writer")
    research_agent, write_agent = RunlogAgent(researcher), RunlogAgent(writer)
    wf = Workflow(WORKFLOW, version="1")

    @wf.stage("research")
    async def research(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"facts": (await research_agent.run(ctx, "look three things up")).output}

    @wf.stage("write", inputs=("style",))
    async def write(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        result = await write_agent.run(ctx, f"write it {inputs['style']}: {ctx.output_of('research')}")
        return {"draft": result.output}

    source = DictInputSource({"style": {"v1": "plainly", "v2": "fancily"}}, latest={"style": "v1"})
    return App.of([wf], [*research_agent.tools(), *write_agent.tools()], source, name=WORKFLOW,
                  prices=PRICES)


def main() -> int:
    arm_from_env()
    settings = Settings.from_env()
    app = usage_app()
    wf = app.registry.get(WORKFLOW)
    with Runner.from_settings(settings, source=app.source, prices=app.prices) as runner:
        handle = runner.start_run(wf, {})
        print(f"run_id={handle.run_id}", flush=True)
        assert handle.session is not None
        completed = runner.execute(handle.session).completed
    print(f"completed={completed}", flush=True)
    return 0 if completed else 1


if __name__ == "__main__":
    sys.exit(main())
