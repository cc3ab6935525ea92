"""A parent agent that hands a question to a sub-agent run as a child run, on each integration (OpenAI
Agents SDK: a handoff; Pydantic AI: a tool that delegates), with scripted offline models whose every
request is counted in a file of the world directory (``model.log``: ``<agent>:<step>`` a line;
``lookup.log``: one line per lookup).

* OpenAI Agents SDK (workflow ``ho-oa``): the ``triage`` agent's model hands off to ``researcher``
  (``transfer_to_researcher``); the researcher's model calls ``lookup`` then answers ``the price is
  1200``, which is the run's final output.
* Pydantic AI (workflow ``ho-pa``): the ``boss`` agent's model calls its tool ``research``, which
  delegates to ``researcher`` (``durable_researcher.delegate(...)``); the researcher looks the price
  up and answers; the boss answers with what the tool returned.

Both stages return ``{"answer": <final output>}``. Run as a process: ``python -m
tests.integration.resume._handoff_agents DIR INTEGRATION resume RUN_ID`` resumes one run with a
resumer (``RUNLOG_CRASH_AT`` armed: it SIGKILLs itself there) and prints ``result=...``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from runlog.processors.resume import App, Resumer
from runlog.producers import AsyncStageContext, DictInputSource, Price, Workflow
from runlog.producers.crash import arm_from_env
from runlog.schemas import Settings

PRICE = Price(input=2, output=8)
INTEGRATIONS = ("openai_agents", "pydantic_ai")
WORKFLOW = {"openai_agents": "ho-oa", "pydantic_ai": "ho-pa"}
LOOKUP_TOOL = {"openai_agents": "openai_agents.tool.researcher.lookup",
               "pydantic_ai": "pydantic_ai.tool.researcher.lookup"}
CHILD_WORKFLOW = {"openai_agents": "openai_agents.agent.researcher",
                  "pydantic_ai": "pydantic_ai.agent.researcher"}
LOOKUP_DONE = {i: f"after:TOOL_RESULT:agent/{LOOKUP_TOOL[i]}/1" for i in INTEGRATIONS}
"""Inside the sub-agent: its first model call and its lookup recorded, its answer not asked yet."""
PARENT_ASKS = {"openai_agents": ["triage:handoff"], "pydantic_ai": ["boss:research", "boss:answer"]}
"""The parent's model requests of a whole run, in order."""
CHILD_ASKS = ["researcher:lookup", "researcher:answer"]
TOKENS = (100, 10)
"""What each scripted model request reports: input and output tokens."""


class World:
    """The files counting what the models and the lookup really did."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def note(self, name: str, line: str) -> None:
        with (self.root / name).open("a") as f:
            f.write(line + "\n")

    def lines(self, name: str) -> list[str]:
        p = self.root / name
        return p.read_text().splitlines() if p.exists() else []

    def asked(self) -> list[str]:
        return self.lines("model.log")

    def lookups(self) -> int:
        return len(self.lines("lookup.log"))

    def lookup(self, sku: str) -> dict[str, Any]:
        self.note("lookup.log", sku)
        return {"sku": sku, "price": 1200}


# -- OpenAI Agents SDK --------------------------------------------------------------------------


def openai_agents_app(root: Path) -> App:
    from agents import Agent, ModelResponse, RunConfig, function_tool
    from agents.items import TResponseStreamEvent
    from agents.models.interface import Model
    from agents.testing import assistant_message, function_call
    from agents.usage import Usage as AgentsUsage

    from runlog.producers.openai_agents import RunlogAgent

    world = World(root)

    def get(item: Any, key: str) -> Any:
        return item.get(key) if isinstance(item, dict) else getattr(item, key, None)

    class Scripted(Model):
        def __init__(self, role: str) -> None:
            self.role = role

        async def get_response(self, system_instructions: str | None, input: Any, model_settings: Any,
                               tools: Any, output_schema: Any, handoffs: Any, tracing: Any, *,
                               previous_response_id: str | None, conversation_id: str | None,
                               prompt: Any) -> ModelResponse:
            items = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
            usage = AgentsUsage(requests=1, input_tokens=TOKENS[0], output_tokens=TOKENS[1],
                                total_tokens=sum(TOKENS))
            if self.role == "triage":
                world.note("model.log", "triage:handoff")
                return ModelResponse(output=[function_call("transfer_to_researcher", "{}", call_id="call-h")],
                                     usage=usage, response_id="r-triage")
            outputs = {get(i, "call_id"): get(i, "output") for i in items
                       if get(i, "type") == "function_call_output"}
            if "call-lookup" not in outputs:
                world.note("model.log", "researcher:lookup")
                sku = str(next(get(i, "content") for i in items if get(i, "role") == "user")).split()[-1]
                out = function_call("lookup", json.dumps({"sku": sku}), call_id="call-lookup")
            else:
                world.note("model.log", "researcher:answer")
                out = assistant_message("the price is 1200")
            return ModelResponse(output=[out], usage=usage, response_id=f"r-{self.role}")

        async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
            raise NotImplementedError("not streamed")
            yield  # pragma: no cover

    @function_tool
    def lookup(sku: str) -> dict[str, Any]:
        """Look a price up."""
        return world.lookup(sku)

    config = RunConfig(tracing_disabled=True)
    researcher = Agent(name="researcher", instructions="Look prices up.", model=Scripted("researcher"),
                       tools=[lookup])
    triage = Agent(name="triage", instructions="Hand price questions to the researcher.",
                   model=Scripted("triage"), handoffs=[researcher])
    durable = RunlogAgent(triage, model_name="scripted", run_config=config,
                          handoffs={"researcher": RunlogAgent(researcher, model_name="scripted",
                                                              run_config=config)})
    wf = Workflow("ho-oa", version="1")

    @wf.stage("ask")
    async def ask(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        result = await durable.run(ctx, f"price of {ctx.params['sku']}")
        return {"answer": result.final_output}

    return App.of([wf, *durable.workflows()], durable.tools(), DictInputSource({}), name="ho-oa",
                  prices={"scripted": PRICE})


# -- Pydantic AI ------------------------------------------------------------------------------------


def pydantic_ai_app(root: Path) -> App:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.usage import RequestUsage

    from runlog.producers.pydantic_ai import RunlogAgent

    world = World(root)

    def returns(messages: list[ModelMessage]) -> dict[str, Any]:
        return {p.tool_name: p.content for m in messages for p in getattr(m, "parts", [])
                if isinstance(p, ToolReturnPart)}

    def prompt(messages: list[ModelMessage]) -> str:
        return str(next(p.content for m in messages for p in getattr(m, "parts", [])
                        if type(p).__name__ == "UserPromptPart"))

    usage = RequestUsage(input_tokens=TOKENS[0], output_tokens=TOKENS[1])

    def boss_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = returns(messages)
        if "research" not in done:
            world.note("model.log", "boss:research")
            return ModelResponse(parts=[ToolCallPart("research", {"sku": prompt(messages).split()[-1]},
                                                     tool_call_id="call-research")], usage=usage)
        world.note("model.log", "boss:answer")
        return ModelResponse(parts=[TextPart(str(done["research"]))], usage=usage)

    def researcher_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = returns(messages)
        if "lookup" not in done:
            world.note("model.log", "researcher:lookup")
            return ModelResponse(parts=[ToolCallPart("lookup", {"sku": prompt(messages).split()[-1]},
                                                     tool_call_id="call-lookup")], usage=usage)
        world.note("model.log", "researcher:answer")
        return ModelResponse(parts=[TextPart(f"the price is {done['lookup']['price']}")], usage=usage)

    researcher = Agent(FunctionModel(researcher_model, model_name="scripted"), name="researcher")

    @researcher.tool_plain
    def lookup(sku: str) -> dict[str, Any]:
        """Look a price up."""
        return world.lookup(sku)

    durable_researcher = RunlogAgent(researcher)
    boss = Agent(FunctionModel(boss_model, model_name="scripted"), name="boss")

    @boss.tool_plain
    async def research(sku: str) -> str:
        """Research a price."""
        answer: str = await durable_researcher.delegate(f"look up {sku}")
        return answer

    durable = RunlogAgent(boss, delegates={"research": durable_researcher})
    wf = Workflow("ho-pa", version="1")

    @wf.stage("ask")
    async def ask(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        result = await durable.run(ctx, f"price of {ctx.params['sku']}")
        return {"answer": result.output}

    return App.of([wf, *durable.workflows()], durable.tools(), DictInputSource({}), name="ho-pa",
                  prices={"function:scripted": PRICE})


def app(integration: str, root: Path) -> App:
    """The application of ``integration`` on the world under ``root``."""
    return openai_agents_app(root) if integration == "openai_agents" else pydantic_ai_app(root)


def main(argv: list[str]) -> int:
    root, integration, mode, run_id = Path(argv[0]), argv[1], argv[2], argv[3]
    assert mode == "resume"
    arm_from_env()
    with Resumer(Settings.from_env(), app(integration, root)) as r:
        out = r.resume(run_id)
    print(f"result={out.result}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
