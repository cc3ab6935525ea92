"""The recorded call an agent tool of a :class:`~runlog.producers.pydantic_ai.RunlogAgent` runs in
(:func:`current_call`), and the model errors its retry policy may retry."""

from __future__ import annotations

from typing import Any

from pydantic_ai.exceptions import (
    ModelConnectionError,
    ModelRateLimitError,
    ModelServerError,
    ModelUnavailableError,
)

from runlog.producers.define._tools import CallInfo
from runlog.producers.integrations._current_call import CurrentCall
from runlog.schemas.errors import TerminalToolError

__all__ = ["RETRYABLE_MODEL_ERRORS", "calling", "current_call", "unbound"]

RETRYABLE_MODEL_ERRORS = (ModelRateLimitError, ModelUnavailableError, ModelServerError, ModelConnectionError)

_CALL = CurrentCall("runlog_pydantic_ai_call")
current_call = _CALL.current_call
calling = _CALL.calling


async def unbound(call: CallInfo, **_: Any) -> Any:
    """The declared tools' function: each recorded call runs with the live request bound instead."""
    raise TerminalToolError(f"{call.tool} is called through RunlogAgent.run, not directly",
                            kind="NotCallable")
