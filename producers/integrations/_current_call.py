"""The recorded call an agent's tool runs in, for the agent integrations (``runlog.producers.pydantic_ai``,
``runlog.producers.openai_agents``): each keeps one :class:`CurrentCall` of its own and sets it around the
tool function it runs inside a recorded call."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from runlog.producers.define._tools import CallInfo

__all__ = ["CurrentCall"]


class CurrentCall:
    """One integration's current tool call (a context variable named ``name``)."""

    def __init__(self, name: str) -> None:
        self._var: ContextVar[CallInfo | None] = ContextVar(name, default=None)

    def get(self) -> CallInfo | None:
        """The call, or None outside a tool call."""
        return self._var.get()

    def current_call(self) -> CallInfo:
        """The :class:`~runlog.producers.CallInfo` of the recorded call an agent tool runs in.

        An effect tool hands ``call.delivery_key`` (or ``call.idempotency_key`` of an ``IDEMPOTENT``
        tool) to the external system, as a Runlog tool function does with its ``call`` argument.

        Raises:
            RuntimeError: outside a tool call of :meth:`RunlogAgent.run`.
        """
        call = self._var.get()
        if call is None:
            raise RuntimeError("current_call() is only available inside a tool call of RunlogAgent.run")
        return call

    @contextmanager
    def calling(self, call: CallInfo) -> Iterator[None]:
        """Make ``call`` the current one while the tool function runs."""
        token = self._var.set(call)
        try:
            yield
        finally:
            self._var.reset(token)
