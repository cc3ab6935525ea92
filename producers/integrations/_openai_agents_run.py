"""The parts of a durable OpenAI Agents SDK run (part of :mod:`runlog.producers.openai_agents`): the call
a function tool runs in (:func:`current_call`), the run's state (:class:`Run`: the positions of a
response's tool calls, the first error a recorded call raised) and the model whose calls are
recorded (:class:`RunlogModel`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import openai
from agents import (
    AgentOutputSchemaBase,
    FunctionTool,
    Handoff,
    ModelResponse,
    ModelSettings,
    TResponseInputItem,
)
from agents import Tool as AgentTool
from agents.items import TResponseStreamEvent
from agents.models.interface import Model, ModelTracing
from openai.types.responses import ResponseFunctionToolCall
from openai.types.responses.response_prompt_param import ResponsePromptParam

from runlog.producers.define._tools import CallInfo, Tool
from runlog.producers.integrations._children import ChildAgent
from runlog.producers.integrations._core import CurrentCall, Positions, model_call
from runlog.producers.integrations._openai_agents_children import handed_off_response
from runlog.producers.integrations._openai_agents_json import (
    decode_response,
    encode_response,
    request_args,
    usage_reader,
)
from runlog.schemas.errors import WorkflowDefinitionError

if TYPE_CHECKING:
    from runlog.producers import AsyncStageContext, CallPosition

__all__ = ["Run", "RunlogModel", "calling", "current_call"]

_RETRYABLE_MODEL_ERRORS = (openai.RateLimitError, openai.APIConnectionError, openai.InternalServerError)
"""Model errors the model tool's RetryPolicy may call again (``APITimeoutError`` is a connection error)."""

_CALL = CurrentCall("runlog_openai_agents_call")
current_call = _CALL.current_call
calling = _CALL.calling


class Run:
    """One durable run: the stage, the positions of the latest response's tool calls, and the first
    error a recorded call raised (the SDK wraps a tool's exception in a ``UserError``; the run
    raises the recorded call's own error, a :class:`~runlog.schemas.errors.Diverged` say)."""

    def __init__(self, stage: AsyncStageContext) -> None:
        self.stage = stage
        self.error: BaseException | None = None
        self.model: Model | None = None
        """The run's durable model (a handed-off agent's stand-in is given it too)."""
        self.handed_to: ChildAgent | None = None
        """The sub-agent the run handed off to: the next model request runs it as a child run."""
        self._pending: set[asyncio.Future[Any]] = set()
        self._positions = Positions(stage)

    def reserve(self, calls: Sequence[ResponseFunctionToolCall]) -> None:
        """The positions of ``calls`` (the function tool calls of one response, in its order); the
        previous response's unused ones stay empty (a call the SDK did not make)."""
        self._positions.reserve([(c.call_id, c.name) for c in calls])

    def position(self, tool_call: tuple[str, str]) -> CallPosition | None:
        """The position reserved for the function tool call ``(call id, tool name)`` (None: none)."""
        return self._positions.take(tool_call)

    def call(self, tool: Tool, tool_call: tuple[str, str], args: Mapping[str, Any]) -> Awaitable[Any]:
        """The recorded call of ``tool`` for the function tool call ``(call id, tool name)`` at its
        reserved position (None: not from the latest response; it takes the stage's next one)."""
        return self._positions.call(tool_call, tool, args)

    async def guard(self, call: Awaitable[Any]) -> Any:
        """Make a recorded call that the SDK cannot cancel halfway: when a sibling tool fails, the
        SDK cancels the others, and a cancelled effect would end with its intent and no result. The
        call goes on (shielded) and :meth:`settle` waits for it; its error is the run's first."""
        task = asyncio.ensure_future(call)
        self._pending.add(task)
        task.add_done_callback(self._done)
        return await asyncio.shield(task)

    def _done(self, task: asyncio.Future[Any]) -> None:
        self._pending.discard(task)
        if not task.cancelled() and task.exception() is not None and self.error is None:
            self.error = task.exception()

    async def settle(self) -> None:
        """Wait for the recorded calls still under way (each ends recorded: a result or FAILED)."""
        while self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)


# -- the model ---------------------------------------------------------------------------------


class RunlogModel(Model):
    """The agent's model for one durable run: each ``get_response`` is a recorded Runlog call."""

    def __init__(self, wrapped: Model, label: str, name: str, model_tool: Tool, run: Run) -> None:
        self.wrapped = wrapped
        self.label = label
        self._name = name
        self._model_tool = model_tool
        self._run = run

    async def get_response(self, system_instructions: str | None, input: str | list[TResponseInputItem],
                           model_settings: ModelSettings, tools: list[AgentTool],
                           output_schema: AgentOutputSchemaBase | None, handoffs: list[Handoff[Any, Any]],
                           tracing: ModelTracing, *, previous_response_id: str | None,
                           conversation_id: str | None, prompt: ResponsePromptParam | None) -> ModelResponse:
        if _CALL.get() is not None:  # an agent run inside a recorded tool call (an agent as a tool
            # inheriting the run config's model): its model calls are part of that call, not recorded
            return await self.wrapped.get_response(
                system_instructions, input, model_settings, tools, output_schema, handoffs, tracing,
                previous_response_id=previous_response_id, conversation_id=conversation_id, prompt=prompt)
        if self._run.handed_to is not None:  # a handoff's stand-in: the sub-agent runs as a child run
            return await handed_off_response(self._run, input, output_schema)
        if model_settings.retry is not None:
            raise WorkflowDefinitionError(
                f"agent {self._name!r}: ModelSettings.retry (the SDK's own model retries) is not "
                "supported by RunlogAgent; use RunlogAgent(..., model_retry=RetryPolicy(...))")
        args = request_args(self.label, system_instructions, input, model_settings, tools, output_schema,
                            handoffs, previous_response_id=previous_response_id,
                            conversation_id=conversation_id, prompt=prompt)
        wrapped = self.wrapped

        async def request(call: CallInfo) -> ModelResponse:
            return await wrapped.get_response(
                system_instructions, input, model_settings, tools, output_schema, handoffs, tracing,
                previous_response_id=previous_response_id, conversation_id=conversation_id, prompt=prompt)

        model_tool = model_call(self._model_tool, request, current=_CALL, retryable=_RETRYABLE_MODEL_ERRORS,
                                encode=encode_response, usage=usage_reader(self.label))
        recorded = await self._run.guard(self._run.stage.call(model_tool, **args))
        response = decode_response(recorded)
        names = {t.name for t in tools if isinstance(t, FunctionTool)}
        self._run.reserve([item for item in response.output
                           if isinstance(item, ResponseFunctionToolCall) and item.name in names])
        return response

    async def stream_response(self, system_instructions: str | None,
                              input: str | list[TResponseInputItem], model_settings: ModelSettings,
                              tools: list[AgentTool], output_schema: AgentOutputSchemaBase | None,
                              handoffs: list[Handoff[Any, Any]], tracing: ModelTracing, *,
                              previous_response_id: str | None, conversation_id: str | None,
                              prompt: ResponsePromptParam | None) -> AsyncIterator[TResponseStreamEvent]:
        raise WorkflowDefinitionError(
            f"agent {self._name!r}: streaming (Runner.run_streamed) is not supported by "
            "RunlogAgent; use RunlogAgent.run, whose model calls are recorded whole")
        yield  # pragma: no cover - makes this an async generator
