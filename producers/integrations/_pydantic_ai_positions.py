"""The call positions of a durable Pydantic AI agent's tool calls (part of
:mod:`runlog.producers.pydantic_ai`).

The tool calls of one model response run concurrently; each is recorded at a position taken in the
response's order when the response arrives (asked of the model or read back), before any of them
runs, so the order they reach the toolset or finish in never changes a call id. A call the agent
does not make (arguments that fail validation, a call deferred for approval, one skipped once the
output is given) leaves its position empty, the same on every re-run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydantic_ai import DeferredToolResults, ToolDenied
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart

if TYPE_CHECKING:
    from runlog.producers import AsyncStageContext, CallPosition

__all__ = ["Positions", "pending_calls"]


class Positions:
    """The positions of the tool calls of the latest model response of one durable agent run."""

    def __init__(self, stage: AsyncStageContext) -> None:
        self._stage = stage
        self._by_call: dict[tuple[str | None, str], list[CallPosition]] = {}

    def reserve(self, parts: Sequence[ToolCallPart]) -> None:
        """Take the positions of ``parts`` (the calls of one response, in its order); the previous
        response's unused ones stay empty."""
        self._by_call = {}
        for part, position in zip(parts, self._stage.reserve(len(parts)) if parts else [], strict=True):
            self._by_call.setdefault((part.tool_call_id, part.tool_name), []).append(position)

    def take(self, tool_call_id: str | None, name: str) -> CallPosition | None:
        """The reserved position of a call (None: not a call of the latest response, such as a
        deferred call resolved inside the run: it takes the next position when it is made)."""
        found = self._by_call.get((tool_call_id, name))
        return found.pop(0) if found else None


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
