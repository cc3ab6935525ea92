"""The recorded call an agent tool of a :class:`~runlog.producers.pydantic_ai.RunlogAgent` runs in
(:func:`current_call`), and the model errors its retry policy may retry."""

from __future__ import annotations

from pydantic_ai.exceptions import (
    ModelConnectionError,
    ModelRateLimitError,
    ModelServerError,
    ModelUnavailableError,
)

from runlog.producers.integrations._core import CurrentCall

__all__ = ["CALL", "RETRYABLE_MODEL_ERRORS", "calling", "current_call"]

RETRYABLE_MODEL_ERRORS = (ModelRateLimitError, ModelUnavailableError, ModelServerError, ModelConnectionError)

CALL = CurrentCall("runlog_pydantic_ai_call")
current_call = CALL.current_call
calling = CALL.calling
