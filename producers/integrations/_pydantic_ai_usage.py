"""What a Pydantic AI model request spent, read from its recorded response: Pydantic AI's
:class:`~pydantic_ai.usage.RequestUsage` as a Runlog :class:`~runlog.schemas.Usage` (part of
:mod:`runlog.producers.pydantic_ai`).

The model is named as the request asked for it, ``"<system>:<model_name>"`` of the wrapped model
(``"openai:gpt-5.2"``), not the response's ``model_name`` (a dated snapshot, say), so a price table
names a model as the agent does. ``input_tokens`` counts every input token, cache reads and writes
included (Pydantic AI's convention for every provider); a response without usage (its provider
sent none) reports nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import TypeAdapter
from pydantic_ai.models import Model
from pydantic_ai.usage import RequestUsage

from runlog.producers.integrations._core import Tokens, usage_reader_of
from runlog.schemas import Usage

__all__ = ["model_label", "usage_reader"]

_REQUEST_USAGE = TypeAdapter(RequestUsage)
"""Reads the ``usage`` of a recorded ``ModelResponse`` alone (the response is not validated again)."""


def model_label(model: Model) -> str:
    """How a model's calls name it in their usage: ``"<system>:<model_name>"``."""
    return f"{model.system}:{model.model_name}"


def _tokens(raw: Mapping[str, Any]) -> Tokens | None:
    u = _REQUEST_USAGE.validate_python(raw)
    if not u.has_values():
        return None
    return Tokens(u.input_tokens, u.output_tokens, u.cache_read_tokens, u.cache_write_tokens)


def usage_reader(model: Model) -> Callable[[Any], Usage | None]:
    """``Tool.usage`` of the requests to ``model``: the recorded response's ``RequestUsage``."""
    return usage_reader_of(model_label(model), _tokens)
