"""Streaming model requests of a :class:`~runlog.producers.pydantic_ai.RunlogAgent`: the recorded call's
function streams the wrapped model, writing each event to the streams topic
(:mod:`runlog.producers.streams`) as it arrives, and returns the whole response, which is what the call
records; the agent gets a stream of that recorded response (Pydantic AI's
``CompletedStreamedResponse`` with its events synthesized), the same on a first run and a replay."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from pydantic_ai.messages import (
    FunctionToolCallEvent,
    ModelMessage,
    ModelResponse,
    PartDeltaEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
    ToolCallPart,
)
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import RunContext
from pydantic_core import to_jsonable_python

from runlog.producers.define._tools import CallInfo
from runlog.producers.streams import StreamAttempt, StreamWriter

if TYPE_CHECKING:
    from runlog.producers import AsyncStageContext

__all__ = ["StreamedTools", "stream_event", "streamed_request", "was_called"]


class StreamedTools:
    """Whether one agent run streams, so that its tool calls stream too: set by the first streamed
    model request (``run_stream``, ``iter`` with ``node.stream``, an ``event_stream_handler``).

    A tool call made while the run streams is an attempt of its own on the streams topic (the
    recorded call's id): ``BEGIN``, an ``EVENT`` with Pydantic AI's ``FunctionToolCallEvent`` (tool
    name, arguments, tool call id), then ``FINAL`` with the call's recorded result once it returns
    (nothing more when it raises: the next attempt supersedes it). A call read back from the log is
    not streamed again, as for model requests."""

    def __init__(self) -> None:
        self.on = False

    def begin(self, writer: StreamWriter, stage: AsyncStageContext, call: CallInfo, name: str,
              tool_call_id: str | None, args: dict[str, Any]) -> ToolStream:
        """The call's stream attempt with its ``FunctionToolCallEvent`` written (call it while
        :attr:`on`)."""
        attempt = writer.begin(run_id=call.run_id, stage=call.stage, call_id=call.call_id,
                               epoch=call.epoch, attempt=call.attempt,
                               supersedes=call.attempt > 1 or was_called(stage, call.index),
                               subject=subject_of(stage))
        part = ToolCallPart(tool_name=name, args=args, tool_call_id=tool_call_id or "")
        event = FunctionToolCallEvent(part=part)
        attempt.event(_json(to_jsonable_python(event)))
        return ToolStream(attempt)


class ToolStream:
    """A streamed tool call's attempt: :meth:`final` writes its recorded result."""

    def __init__(self, attempt: StreamAttempt) -> None:
        self._attempt = attempt

    def final(self, result: Any) -> None:
        self._attempt.final(_json(result))


def _json(doc: Any) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def was_called(stage: AsyncStageContext, index: int) -> bool:
    """Whether the log records a call at ``index`` of the stage without a result: an earlier
    attempt (a process that died mid-stream) whose streamed output a new attempt supersedes."""
    recorded = getattr(stage, "_at_index", {}).get(index)
    return recorded is not None and getattr(recorded, "result", None) is None


def subject_of(stage: AsyncStageContext) -> str | None:
    """The run's subject (its records are sealed under its key when encryption is on)."""
    session = getattr(stage, "session", None)
    subject = getattr(session, "subject", None)
    return subject if isinstance(subject, str) else None


def stream_event(attempt: StreamAttempt, event: Any) -> None:
    """One model stream event as a stream record: text as ``DELTA``, anything else as ``EVENT``."""
    if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
        attempt.delta(event.index, event.part.content)
    elif isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
        attempt.delta(event.index, event.delta.content_delta)
    else:
        attempt.event(_json(to_jsonable_python(event)))


def streamed_request(wrapped: Model, writer: Callable[[], StreamWriter], stage: AsyncStageContext,
                     messages: list[ModelMessage], model_settings: ModelSettings | None,
                     parameters: ModelRequestParameters, run_context: RunContext[Any] | None,
                     encode: Callable[[ModelResponse], Any],
                     ) -> Callable[[CallInfo], Awaitable[ModelResponse]]:
    """The function a streaming request's recorded call runs: stream ``wrapped``, writing each
    event of this attempt to the streams topic, and return the whole response (``FINAL`` written
    with ``encode(response)`` as JSON)."""

    async def fn(call: CallInfo) -> ModelResponse:
        attempt = writer().begin(run_id=call.run_id, stage=call.stage, call_id=call.call_id,
                                 epoch=call.epoch, attempt=call.attempt,
                                 supersedes=call.attempt > 1 or was_called(stage, call.index),
                                 subject=subject_of(stage))
        async with wrapped.request_stream(messages, model_settings, parameters, run_context) as streamed:
            async for event in streamed:
                stream_event(attempt, event)
            response = streamed.get()
        attempt.final(_json(encode(response)))
        return response

    return fn
