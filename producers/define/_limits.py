"""Rate limits a fleet shares, as a tool declares them: requests and tokens per period for one key
(a model, a provider account). Counted in Redis by :mod:`runlog.producers.calls._limiter`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from runlog.schemas.errors import WorkflowDefinitionError

__all__ = ["EstimateFn", "RateLimit"]

EstimateFn = Callable[[Mapping[str, Any]], int]
"""``(call arguments) -> tokens the call is expected to spend`` (prompt and answer together)."""


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``requests`` calls and ``tokens`` tokens per ``per_s`` seconds for ``key`` (None: no
    cap on that measure), shared by every process whose Runner counts in the same Redis and prefix.
    Declared on a tool (``@tool(..., limit=RateLimit("openai:gpt-4o", requests=600, tokens=100_000),
    estimate=lambda args: ...)``); several tools naming one key share one budget."""

    key: str
    requests: int | None = None
    tokens: int | None = None
    per_s: float = 60.0

    def __post_init__(self) -> None:
        if not self.key:
            raise WorkflowDefinitionError("a rate limit needs a key")
        if self.requests is None and self.tokens is None:
            raise WorkflowDefinitionError(f"rate limit {self.key!r}: give requests, tokens or both")
        for name, v in (("requests", self.requests), ("tokens", self.tokens)):
            if v is not None and v < 1:
                raise WorkflowDefinitionError(f"rate limit {self.key!r}: {name} must be at least 1, not {v}")
        if self.per_s <= 0:
            raise WorkflowDefinitionError(
                f"rate limit {self.key!r}: per_s must be positive, not {self.per_s}")
