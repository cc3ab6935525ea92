"""The recorded call an agent tool of a :class:`~producers.pydantic_ai.RunlogAgent` runs in
(:func:`current_call`), and the model errors its retry policy may retry."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from pydantic_ai.exceptions import (
    ModelConnectionError,
    ModelRateLimitError,
    ModelServerError,
    ModelUnavailableError,
)

from producers.define._tools import CallInfo
from schemas.errors import TerminalToolError

__all__ = ["RETRYABLE_MODEL_ERRORS", "calling", "current_call", "unbound"]

RETRYABLE_MODEL_ERRORS = (ModelRateLimitError, ModelUnavailableError, ModelServerError, ModelConnectionError)

_current: ContextVar[CallInfo | None] = ContextVar("runlog_pydantic_ai_call", default=None)


def current_call() -> CallInfo:
    """The :class:`~producers.CallInfo` of the recorded call an agent tool runs in.

    An effect tool hands ``call.delivery_key`` (or ``call.idempotency_key`` of an ``IDEMPOTENT``
    tool) to the external system, as a Runlog tool function does with its ``call`` argument.

    Raises:
        RuntimeError: outside a tool call of :meth:`RunlogAgent.run`.
    """
    call = _current.get()
    if call is None:
        raise RuntimeError("current_call() is only available inside a tool call of RunlogAgent.run")
    return call


@contextmanager
def calling(call: CallInfo) -> Iterator[None]:
    token = _current.set(call)
    try:
        yield
    finally:
        _current.reset(token)



async def unbound(call: CallInfo, **_: Any) -> Any:
    """The declared tools' function: each recorded call runs with the live request bound instead."""
    raise TerminalToolError(f"{call.tool} is called through RunlogAgent.run, not directly",
                            kind="NotCallable")
