"""Handoffs and agents-as-tools of a durable OpenAI Agents SDK agent as child runs (part of
:mod:`runlog.producers.openai_agents`; the shared part is :mod:`._children`).

* A handoff: the SDK's own ``on_invoke_handoff`` runs (``on_handoff``, its input checks), then the
  agent it returns is replaced, for the rest of the SDK's loop, by a stand-in with no tools and no
  handoffs whose model is the run's durable model; :attr:`Run.handed_to` tells that model to answer
  by running the sub-agent as a child run (:func:`handed_off_response`): the conversation the SDK
  gives the stand-in (after the handoff's input filter) is the child's input, its final output the
  stand-in's answer, which the SDK validates with the handed-off agent's output type.
* An agent as a tool (``agent_tools="child"``): the function tool's call starts the child at the
  position reserved for the tool call when its response arrived (:func:`run_agent_tool`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol

import pydantic_core
from agents import Agent, AgentOutputSchemaBase, FunctionTool, ModelResponse, TResponseInputItem
from agents.models.interface import Model
from agents.usage import Usage as AgentsUsage
from openai.types.responses import ResponseOutputMessage, ResponseOutputRefusal, ResponseOutputText
from pydantic_core import to_jsonable_python

from runlog.producers.calls._keys import canonical_json
from runlog.producers.integrations._children import ChildAgent, run_child
from runlog.producers.integrations._openai_agents_json import jsonable

if TYPE_CHECKING:
    from agents.tool_context import ToolContext

    from runlog.producers import AsyncStageContext, CallPosition

__all__ = ["RunParts", "agent_tool_input", "child_output", "handed_off", "handed_off_response",
           "run_agent_tool"]


class RunParts(Protocol):
    """What these steps use of a durable run (``_openai_agents_run.Run``, which imports this module)."""

    stage: AsyncStageContext
    model: Model | None
    handed_to: ChildAgent | None

    def position(self, tool_call: tuple[str, str]) -> CallPosition | None: ...

    def guard(self, call: Awaitable[Any]) -> Awaitable[Any]: ...


_WRAPPED_KEY = "response"
"""The key the SDK wraps an output type that is no object in (``AgentOutputSchema``)."""


def child_output(final_output: Any) -> dict[str, Any]:
    """A sub-agent's final output as its child run's stage output: ``output`` (JSON) and ``text``
    (the output itself when text, else its JSON text)."""
    data = jsonable(lambda: to_jsonable_python(final_output, by_alias=True), "the sub-agent's final output")
    text = final_output if isinstance(final_output, str) else pydantic_core.to_json(final_output).decode()
    return {"output": data, "text": text}


def handed_off(target: Agent[Any], sub: ChildAgent, run: RunParts) -> Agent[Any]:
    """The stand-in for ``target`` after a handoff: the run's next model request starts ``sub``'s
    child run instead (:func:`handed_off_response`)."""
    run.handed_to = sub
    stand_in: Agent[Any] = target.clone(model=run.model, tools=[], handoffs=[], input_guardrails=[],
                                        output_guardrails=[], mcp_servers=[])
    return stand_in


async def handed_off_response(run: RunParts, input: str | list[TResponseInputItem],
                              output_schema: AgentOutputSchemaBase | None) -> ModelResponse:
    """The handed-off agent's answer: its child run's final output, as one assistant message."""
    sub = run.handed_to
    assert sub is not None
    items = jsonable(lambda: to_jsonable_python(input, by_alias=True), "the handed-off conversation")
    out = await run.guard(run_child(run.stage, None, sub.workflow, {"input": items}))
    text = str(out.get("text", ""))
    wrapped = output_schema is not None and not output_schema.is_plain_text() \
        and getattr(output_schema, "_is_wrapped", False)
    if wrapped:
        text = json.dumps({_WRAPPED_KEY: out.get("output")})
    content: list[ResponseOutputText | ResponseOutputRefusal] = [
        ResponseOutputText(type="output_text", text=text, annotations=[])]
    message = ResponseOutputMessage(id="runlog-child", type="message", role="assistant", status="completed",
                                    content=content)
    return ModelResponse(output=[message], usage=AgentsUsage(), response_id=None)


def agent_tool_input(arguments: str) -> str:
    """The sub-agent's input of an agent tool call: its ``input`` argument, else its JSON arguments."""
    try:
        args = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        return arguments
    if isinstance(args, dict) and set(args) == {"input"} and isinstance(args["input"], str):
        return args["input"]
    return canonical_json(args).decode()


def run_agent_tool(t: FunctionTool, sub: ChildAgent, run: RunParts) -> FunctionTool:
    """``Agent.as_tool``'s function tool ``t`` whose calls run ``sub`` as a child run (at the tool
    call's reserved position) and answer with its final output as text."""
    import dataclasses

    async def invoke(tool_ctx: ToolContext[Any], arguments: str) -> Any:
        position = run.position((tool_ctx.tool_call_id, t.name))
        params = {"input": agent_tool_input(arguments)}
        out = await run.guard(run_child(run.stage, position, sub.workflow, params))
        return str(out.get("text", ""))

    return dataclasses.replace(t, on_invoke_tool=invoke)
