"""What :mod:`runlog.producers.openai_agents` records, as JSON: a model request's arguments, a model
response (its output items, the ``openai`` package's pydantic models, in their wire form; its usage,
ids), a tool's result, and what a response spent as a Runlog :class:`~runlog.schemas.Usage`. Anything
that is not JSON data raises :class:`~runlog.schemas.errors.WorkflowDefinitionError` naming it."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import agents.tool
from agents import (
    AgentOutputSchemaBase,
    FunctionTool,
    Handoff,
    ModelResponse,
    ModelSettings,
    Tool,
    TResponseInputItem,
)
from agents.items import TResponseOutputItem
from agents.usage import deserialize_usage, serialize_usage
from pydantic import TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError, to_jsonable_python

from runlog.producers.calls._keys import canonical_json
from runlog.producers.integrations._core import Tokens, usage_reader_of
from runlog.schemas import Usage
from runlog.schemas.errors import TerminalToolError, WorkflowDefinitionError

__all__ = ["decode_response", "decode_result", "encode_response", "encode_result", "jsonable",
           "request_args", "tool_description", "usage_reader"]

_MARK = "$openai_agents"
"""Key of the envelope a recorded tool result uses for what is not the tool's plain return value."""
SDK_ERROR_ATTR: str = getattr(agents.tool, "_DEFAULT_FAILURE_HANDLED_ATTR",
                              "_function_tool_default_failure_handled")
"""The flag the SDK sets on a ``ToolContext`` when its default failure handler answered for the
tool (the answer then bypasses the tool's output schema): recorded, and set again on replay."""

_OUTPUT_ITEMS: TypeAdapter[list[TResponseOutputItem]] = TypeAdapter(list[TResponseOutputItem])


def jsonable(make: Callable[[], Any], what: str) -> Any:
    """``make()`` as JSON data in its recorded form (object keys sorted, as a replay reads it back:
    the SDK renders a tool's dict result with ``str()``, so the order is part of what the model
    sees); anything that is not JSON data is a WorkflowDefinitionError."""
    try:
        return json.loads(canonical_json(make()))
    except (PydanticSerializationError, TypeError, ValueError, WorkflowDefinitionError) as err:
        raise WorkflowDefinitionError(
            f"Runlog records {what} as JSON, and this is not JSON data: {err}") from err


def tool_description(tool: Tool) -> dict[str, Any]:
    """A tool as the model is told of it (part of a request's recorded arguments)."""
    if isinstance(tool, FunctionTool):
        return {"type": "function", "name": tool.name, "description": tool.description,
                "parameters": tool.params_json_schema, "strict": tool.strict_json_schema}
    try:  # a hosted tool (web search, file search, code interpreter, ...): its settings
        config = to_jsonable_python(tool)
    except (PydanticSerializationError, TypeError, ValueError):  # a callback among them: its config
        config = getattr(tool, "tool_config", None)
    return {"type": type(tool).__name__, "name": tool.name,
            "config": jsonable(lambda: to_jsonable_python(config),
                               f"the configuration of tool {tool.name!r}")}


def _output_schema(schema: AgentOutputSchemaBase | None) -> dict[str, Any] | None:
    if schema is None:
        return None
    return {"name": schema.name(), "plain_text": schema.is_plain_text(),
            "json_schema": None if schema.is_plain_text() else schema.json_schema(),
            "strict": schema.is_strict_json_schema()}


def request_args(model: str, system_instructions: str | None, input: str | list[TResponseInputItem],
                 model_settings: ModelSettings, tools: Sequence[Tool],
                 output_schema: AgentOutputSchemaBase | None, handoffs: Sequence[Handoff[Any, Any]], *,
                 previous_response_id: str | None, conversation_id: str | None,
                 prompt: Any) -> dict[str, Any]:
    """The recorded arguments of a model request (the call's arguments, compared on resume)."""
    return {
        "model": model,
        "instructions": system_instructions,
        "input": jsonable(lambda: to_jsonable_python(input, by_alias=True), "the model's input items"),
        "model_settings": jsonable(model_settings.to_json_dict, "model settings"),
        "tools": [tool_description(t) for t in tools],
        "output_schema": jsonable(lambda: _output_schema(output_schema), "the output schema"),
        "handoffs": [{"tool_name": h.tool_name, "agent_name": h.agent_name,
                      "input_json_schema": h.input_json_schema} for h in handoffs],
        "previous_response_id": previous_response_id,
        "conversation_id": conversation_id,
        "prompt": jsonable(lambda: to_jsonable_python(prompt), "the prompt"),
    }


def encode_response(response: ModelResponse) -> dict[str, Any]:
    """A model response as recorded: its output items in their wire form (fields left unset are
    left out, so a recorded response read back and recorded again is the same JSON)."""
    data: dict[str, Any] = jsonable(lambda: {
        "output": [i.model_dump(mode="json", by_alias=True, exclude_unset=True) for i in response.output],
        "usage": serialize_usage(response.usage),
        "response_id": response.response_id,
        "request_id": response.request_id,
    }, "a model response")
    return data


def decode_response(data: Any) -> ModelResponse:
    """A recorded model response back."""
    if not isinstance(data, Mapping) or not isinstance(data.get("output"), list):
        raise TerminalToolError(f"a recorded model response is not an object with 'output': {data!r:.200}",
                                kind="InvalidModelResponse")
    try:
        output = _OUTPUT_ITEMS.validate_python(data["output"])
    except ValidationError as err:
        raise TerminalToolError(f"a recorded model response has output items this SDK cannot read: {err}",
                                kind="InvalidModelResponse") from err
    return ModelResponse(output=output, usage=deserialize_usage(data.get("usage") or {}),
                         response_id=data.get("response_id"), request_id=data.get("request_id"))


def encode_result(result: Any, tool: str, *, sdk_error: bool = False) -> Any:
    """A tool's return value as recorded, and as the agent gets it (in the first run too): JSON data
    (a pydantic model as its JSON object, which the SDK reads as it reads the model itself for its
    structured outputs ``ToolOutputText``, ``ToolOutputImage``, ``ToolOutputFileContent``); the SDK's
    own answer to the tool's exception (``sdk_error``) in an envelope that says so."""
    value = jsonable(lambda: to_jsonable_python(result, by_alias=True), f"the result of tool {tool!r}")
    if sdk_error:
        return {_MARK: "sdk_error", "value": value}
    if isinstance(value, dict) and _MARK in value:
        return {_MARK: "value", "value": value}
    return value


def decode_result(data: Any, tool_ctx: Any) -> Any:
    """A recorded tool result back (the SDK's answer to an exception flagged on ``tool_ctx`` again)."""
    if not (isinstance(data, dict) and isinstance(data.get(_MARK), str)):
        return data  # a plain return value, or an effect's record (as executed or reconciled)
    if data[_MARK] == "sdk_error":
        setattr(tool_ctx, SDK_ERROR_ATTR, True)
    elif data[_MARK] != "value":
        raise TerminalToolError(f"a recorded tool result has an unknown kind {data[_MARK]!r}",
                                kind="InvalidToolResult")
    return data["value"]


def _tokens(raw: Mapping[str, Any]) -> Tokens | None:
    u = deserialize_usage(raw)
    if not (u.input_tokens or u.output_tokens):
        return None  # the provider sent none
    details = u.input_tokens_details
    return Tokens(u.input_tokens, u.output_tokens, getattr(details, "cached_tokens", 0) or 0,
                  getattr(details, "cache_write_tokens", 0) or 0)


def usage_reader(label: str) -> Callable[[Any], Usage | None]:
    """``Tool.usage`` of a model's requests: the recorded response's ``Usage`` under ``label``."""
    return usage_reader_of(label, _tokens)
