"""What :mod:`runlog.producers.pydantic_ai` records, as JSON: the messages of a conversation
(:func:`dump_messages`, :func:`load_messages`), a model request's arguments without what changes
on every run, a model response, and a tool's result or control-flow exception (``ModelRetry``,
``ToolFailed``, ``CallDeferred``, ``ApprovalRequired``) in an envelope that gives it back on
replay. Anything that is not JSON data raises :class:`~runlog.schemas.errors.WorkflowDefinitionError`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic import TypeAdapter
from pydantic_ai import ApprovalRequired, CallDeferred, ModelMessagesTypeAdapter, ModelRetry, ToolFailed
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolReturn, tool_return_content_ta
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.settings import ModelSettings
from pydantic_core import PydanticSerializationError, to_jsonable_python

from runlog.producers.calls._keys import canonical_json
from runlog.schemas.errors import TerminalToolError, WorkflowDefinitionError

__all__ = ["decode_response", "decode_result", "dump_messages", "encode_response", "encode_result",
           "encode_signal", "jsonable", "load_messages", "request_args"]

_MARK = "$pydantic_ai"
"""Key of the envelope a recorded tool result uses for what is not a plain JSON return value."""
_GENERATED_ID = "pyd_ai_"
"""Prefix of the tool call ids Pydantic AI generates (``pydantic_ai._utils.TOOL_CALL_ID_PREFIX``)."""
_VOLATILE_MESSAGE_KEYS = ("timestamp", "run_id", "conversation_id")
_TOOL_RETURN = TypeAdapter(ToolReturn)


def dump_messages(messages: Sequence[ModelMessage]) -> list[Any]:
    """Messages as JSON data (``ModelMessagesTypeAdapter``): what a stage returns to pass an
    agent's conversation on to a later stage."""
    data: list[Any] = jsonable(lambda: ModelMessagesTypeAdapter.dump_python(list(messages), mode="json"),
                                "messages")
    return data


def load_messages(data: Sequence[Any]) -> list[ModelMessage]:
    """Messages back from :func:`dump_messages`' JSON data (``message_history=`` of a later run)."""
    return ModelMessagesTypeAdapter.validate_python(list(data))


def jsonable(make: Any, what: str) -> Any:
    """``make()``, checked to be plain JSON data; anything else is a WorkflowDefinitionError."""
    try:
        value = make()
        canonical_json(value)
    except (PydanticSerializationError, TypeError, ValueError, WorkflowDefinitionError) as err:
        raise WorkflowDefinitionError(
            f"Runlog records {what} as JSON, and this is not JSON data: {err}") from err
    return value


def _stable_messages(messages: Sequence[ModelMessage]) -> list[Any]:
    """The messages of a request as recorded: without what changes on every run."""
    data = dump_messages(messages)
    for message in data:
        for key in _VOLATILE_MESSAGE_KEYS:
            message.pop(key, None)
        for part in message.get("parts") or ():
            if isinstance(part, dict):
                part.pop("timestamp", None)
                tcid = part.get("tool_call_id")
                if isinstance(tcid, str) and tcid.startswith(_GENERATED_ID):
                    part["tool_call_id"] = _GENERATED_ID + "*"
    return data


def request_args(model: Model, messages: Sequence[ModelMessage], settings: ModelSettings | None,
                  params: ModelRequestParameters) -> dict[str, Any]:
    """The recorded arguments of a model request (the call's arguments, compared on resume)."""
    return {
        "model": model.model_name,
        "system": model.system,
        "messages": _stable_messages(messages),
        "model_settings": jsonable(lambda: to_jsonable_python(settings), "model settings"),
        "parameters": jsonable(lambda: to_jsonable_python(params),
                                "model request parameters (tool definitions, output schema)"),
    }


def encode_response(response: ModelResponse) -> Any:
    """A model response as recorded."""
    return jsonable(lambda: ModelMessagesTypeAdapter.dump_python([response], mode="json")[0],
                     "a model response")


def decode_response(data: Any) -> ModelResponse:
    """A recorded model response back."""
    [message] = ModelMessagesTypeAdapter.validate_python([data])
    if not isinstance(message, ModelResponse):
        raise TerminalToolError(f"a recorded model response is a {type(message).__name__}",
                                kind="InvalidModelResponse")
    return message


def _is_plain(value: Any) -> bool:
    try:
        return bool(json.loads(canonical_json(value)) == value)
    except (WorkflowDefinitionError, TypeError, ValueError):
        return False


def encode_result(result: Any, tool: str, *, effect: bool) -> Any:
    """A tool's return value as recorded: plain JSON as it is, anything else in an envelope."""
    what = f"the result of tool {tool!r}"
    if effect:  # the record of the effect: a JSON object with "external_id", checked by the core
        return jsonable(lambda: to_jsonable_python(result), what)
    if isinstance(result, ToolReturn):
        return {_MARK: "tool_return",
                "value": jsonable(lambda: _TOOL_RETURN.dump_python(result, mode="json"), what)}
    if _is_plain(result) and not (isinstance(result, dict) and _MARK in result):
        return result
    return {_MARK: "value", "value": jsonable(lambda: to_jsonable_python(result), what)}


def encode_signal(err: Exception) -> dict[str, Any]:
    """A control-flow exception of a tool as recorded data (raised again by ``decode_result``)."""
    if isinstance(err, ModelRetry):
        return {_MARK: "model_retry", "message": err.message}
    if isinstance(err, ToolFailed):
        return {_MARK: "tool_failed", "message": err.message}
    if isinstance(err, ApprovalRequired):
        return {_MARK: "approval_required", "metadata": jsonable(lambda: to_jsonable_python(err.metadata),
                                                                  "ApprovalRequired metadata")}
    assert isinstance(err, CallDeferred)
    return {_MARK: "call_deferred", "kind": err.kind,
            "metadata": jsonable(lambda: to_jsonable_python(err.metadata), "CallDeferred metadata")}


def decode_result(data: Any) -> Any:
    """A recorded tool result back: its value, or its exception raised again."""
    if not (isinstance(data, dict) and isinstance(data.get(_MARK), str)):
        return data  # a plain return value, or an effect's record (as executed or reconciled)
    kind = data[_MARK]
    if kind == "value":  # multimodal content (BinaryContent, ImageUrl, ...) comes back as itself
        return tool_return_content_ta.validate_python(data["value"])
    if kind == "tool_return":
        return _TOOL_RETURN.validate_python(data["value"])
    if kind == "model_retry":
        raise ModelRetry(data["message"])
    if kind == "tool_failed":
        raise ToolFailed(data["message"])
    if kind == "approval_required":
        raise ApprovalRequired(metadata=data.get("metadata"))
    if kind == "call_deferred":
        raise CallDeferred(metadata=data.get("metadata"), kind=data.get("kind", "external"))
    raise TerminalToolError(f"a recorded tool result has an unknown kind {kind!r}", kind="InvalidToolResult")
