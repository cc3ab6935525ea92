"""The tool calls whose call positions a durable Pydantic AI agent reserves (part of
:mod:`runlog.producers.pydantic_ai`; the positions are the integration core's
:class:`~runlog.producers.integrations._core.Positions`): those of each model response, and those of
the history a run starts from. A call the agent does not make (arguments that fail validation, a call
deferred for approval, one skipped once the output is given) leaves its position empty, the same on
every re-run.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic_ai import DeferredToolResults, ToolDenied
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart

from runlog.producers.integrations._core import CallKey

__all__ = ["call_keys", "pending_calls"]


def pending_calls(history: Sequence[ModelMessage] | None, results: DeferredToolResults | None,
                  ) -> list[ToolCallPart]:
    """The calls an agent run makes before it asks the model anything: those of the history's last
    response that ``results`` approves, or, without results, all calls of a history that ends with a
    response."""
    if not history:
        return []
    if results is None:
        last = history[-1]
        if not isinstance(last, ModelResponse):
            return []
        return [p for p in last.parts if isinstance(p, ToolCallPart)]
    response = next((m for m in reversed(history) if isinstance(m, ModelResponse)), None)
    if response is None:
        return []
    return [p for p in response.parts if isinstance(p, ToolCallPart) and p.tool_call_id in results.approvals
            and not isinstance(results.approvals[p.tool_call_id], ToolDenied)
            and results.approvals[p.tool_call_id] is not False]


def call_keys(parts: Sequence[ToolCallPart]) -> list[CallKey]:
    """The calls ``parts`` as positions are reserved for them: ``(tool call id, tool name)``."""
    return [(p.tool_call_id, p.tool_name) for p in parts]
