"""The core every durable agent integration builds on (:mod:`runlog.producers.openai_agents`,
:mod:`runlog.producers.pydantic_ai`): what makes an agent's model requests and tool calls recorded
Runlog calls, whatever the agent framework.

* :class:`DurableAgent`: the base of each integration's ``RunlogAgent``: the agent's name and the
  Runlog tools its calls are recorded as, its declarations checked (the name, the replay policies,
  the mapped tools): the model's tool, ``<integration>.model.<name>``, and one per agent tool
  (:meth:`DurableAgent.tool_for`), the mapped one or ``<integration>.tool.<name>.<tool>``.
* :class:`CurrentCall`: the recorded call an agent tool runs in (an integration's ``current_call``).
* :func:`model_call`: the model's tool bound to one live request: model errors the retry policy may
  retry raised as :class:`~runlog.schemas.errors.RetryableToolError`, the response recorded in its
  JSON form, with what it spent (:func:`usage_reader_of`).
* :class:`Positions`: the call positions of one model response's tool calls, taken in the response's
  order when it arrives (recorded or new), so the order the calls run or finish in never changes a
  call id.

Sub-agents run as child runs (a handoff, a delegation) through :mod:`._children`: the workflow a
durable agent runs in as a child, and the step that starts it and reads its output.

An integration keeps what is its framework's own: where the model and the tools are hooked in, what
a request, a response and a tool result are as JSON, and the checks of what its framework can do
that a recorded run cannot.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from runlog.producers.define._tools import CallInfo, RetryPolicy, Tool
from runlog.schemas import ReplayPolicy, Usage
from runlog.schemas.errors import RetryableToolError, TerminalToolError, WorkflowDefinitionError

if TYPE_CHECKING:
    from runlog.producers import AsyncStageContext, CallPosition

__all__ = ["CallKey", "CurrentCall", "DurableAgent", "Positions", "Tokens", "model_call", "unbound",
           "usage_reader_of"]

R = TypeVar("R")

CallKey = tuple[str | None, str]
"""An agent tool call as a model response names it: ``(tool call id, tool name)``."""


# -- the declared tools --------------------------------------------------------------------------


class DurableAgent:
    """What every integration's ``RunlogAgent`` is: an agent's name and the Runlog tools its calls
    are recorded as, its declarations checked.

    Args:
        integration: prefix of the tools' names (``"pydantic_ai"``: ``pydantic_ai.model.<name>``).
        name: the agent's name in the tools' names.
        name_hint: how to give a name, for the error of a missing or bad one.
        model_policy: replay policy of the model's calls, ``SAFE`` or ``IDEMPOTENT``.
        model_retry: retry policy of a model call (default: ``RetryPolicy()``).
        model_args_by_ref: the model call's arguments stored by reference (``Tool.args_by_ref``).
        tools: agent tool name -> the Runlog :class:`~runlog.producers.Tool` its calls are recorded as.
        tools_policy: replay policy of every other agent tool, ``SAFE`` or ``IDEMPOTENT``.

    Raises:
        WorkflowDefinitionError: no name, a name with '/', a policy that needs a declaration, a
            mapping that is not a Runlog Tool.
    """

    def __init__(self, integration: str, name: str, *, name_hint: str, model_policy: ReplayPolicy,
                 model_retry: RetryPolicy | None, model_args_by_ref: tuple[str, ...],
                 tools: Mapping[str, Tool] | None, tools_policy: ReplayPolicy) -> None:
        if not name or "/" in name:
            raise WorkflowDefinitionError(
                f"RunlogAgent needs a name without '/' ({name_hint}): "
                "it names the agent's recorded calls, which a resume must find again")
        for what, policy in (("model_policy", model_policy), ("tools_policy", tools_policy)):
            if policy not in (ReplayPolicy.SAFE, ReplayPolicy.IDEMPOTENT):
                raise WorkflowDefinitionError(
                    f"RunlogAgent {name!r}: {what} must be SAFE or IDEMPOTENT, not {policy.value}; "
                    "map an effect tool to a declared Runlog Tool with tools={name: tool(...)}")
        self.name = name
        """Names the Runlog tools of this agent."""
        self.tools_policy = tools_policy
        """Replay policy of the agent tools ``tools=`` does not map."""
        self._mapped: dict[str, Tool] = dict(tools or {})
        for agent_tool, t in self._mapped.items():
            if not isinstance(t, Tool):
                raise WorkflowDefinitionError(f"RunlogAgent {name!r}: tools[{agent_tool!r}] must be a "
                                              f"Runlog Tool, got {type(t).__name__}")
        self._auto: dict[str, Tool] = {}
        self._integration = integration
        self.model_tool = Tool(f"{integration}.model.{name}", unbound, model_policy,
                               retry=model_retry or RetryPolicy(), args_by_ref=model_args_by_ref)
        """The Runlog tool the model's calls are recorded as."""

    def tool_for(self, agent_tool: str) -> Tool:
        """The Runlog tool calls of the agent tool named ``agent_tool`` are recorded as: the one
        ``tools=`` maps it to, else ``<integration>.tool.<name>.<agent_tool>`` with ``tools_policy``."""
        if agent_tool in self._mapped:
            return self._mapped[agent_tool]
        t = self._auto.get(agent_tool)
        if t is None:
            t = self._auto[agent_tool] = Tool(f"{self._integration}.tool.{self.name}.{agent_tool}", unbound,
                                              self.tools_policy)
        return t

    def tools(self) -> list[Tool]:
        """The Runlog tools declared for this agent (the model's and the mapped ones), for
        ``App.of(..., tools=...)``: resume reconciles ``RECONCILE_FIRST`` intents with them."""
        return [self.model_tool, *self._mapped.values()]


async def unbound(call: CallInfo, **_: Any) -> Any:
    """The declared tools' function: each recorded call runs with the live request bound instead."""
    raise TerminalToolError(f"{call.tool} is called through RunlogAgent.run, not directly",
                            kind="NotCallable")


# -- the current call ----------------------------------------------------------------------------


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


# -- the model's calls -----------------------------------------------------------------------------


def model_call(model_tool: Tool, request: Callable[[CallInfo], Awaitable[R]], *, current: CurrentCall,
               retryable: tuple[type[Exception], ...], encode: Callable[[R], Any],
               usage: Callable[[Any], Usage | None]) -> Tool:
    """``model_tool`` bound to one live request: its function makes ``request`` as ``current``'s call
    (an ``IDEMPOTENT`` model reads its key with ``current_call``), raises a ``retryable`` model error
    as a :class:`~runlog.schemas.errors.RetryableToolError` (the tool's RetryPolicy may call it
    again; any other fails the call), and records ``encode(response)``, with ``usage`` of it."""

    async def fn(call: CallInfo, **_: Any) -> Any:
        with current.calling(call):
            try:
                response = await request(call)
            except retryable as err:
                raise RetryableToolError(f"{type(err).__name__}: {err}", kind=type(err).__name__) from err
        return encode(response)

    return dataclasses.replace(model_tool, fn=fn, usage=usage)


class Tokens(NamedTuple):
    """What one model response says it spent."""

    input: int
    output: int
    cache_read: int
    cache_write: int


def usage_reader_of(label: str, tokens: Callable[[Mapping[str, Any]], Tokens | None],
                    ) -> Callable[[Any], Usage | None]:
    """``Tool.usage`` of a model's calls: ``tokens`` of the recorded response's ``"usage"`` object
    (None: it spent nothing the provider reported) as a :class:`~runlog.schemas.Usage` of the model
    named ``label`` (the name a price table gives its price under)."""

    def read(result: Any) -> Usage | None:
        raw = result.get("usage") if isinstance(result, Mapping) else None
        if not isinstance(raw, Mapping):
            return None
        t = tokens(raw)
        if t is None:
            return None
        return Usage(label, input_tokens=t.input, output_tokens=t.output, cache_read_tokens=t.cache_read,
                     cache_write_tokens=t.cache_write)

    return read


# -- the positions of a response's tool calls ------------------------------------------------------


class Positions:
    """The call positions of the tool calls of the latest model response of one durable agent run.

    The tool calls of one response run concurrently; each is recorded at a position taken in the
    response's order when the response arrives (asked of the model or read back), before any of them
    runs. A call the agent does not make leaves its position empty, the same on every re-run.
    """

    def __init__(self, stage: AsyncStageContext) -> None:
        self._stage = stage
        self._by_call: dict[CallKey, list[CallPosition]] = {}

    def reserve(self, calls: Sequence[CallKey]) -> None:
        """Take the positions of ``calls`` (those of one response, in its order); the previous
        response's unused ones stay empty."""
        self._by_call = {}
        for key, position in zip(calls, self._stage.reserve(len(calls)) if calls else [], strict=True):
            self._by_call.setdefault(key, []).append(position)

    def take(self, call: CallKey) -> CallPosition | None:
        """The reserved position of a call (None: not a call of the latest response, such as a
        deferred call resolved inside the run: it takes the stage's next position when it is made)."""
        found = self._by_call.get(call)
        return found.pop(0) if found else None

    def call(self, call: CallKey, tool: Tool, args: Mapping[str, Any]) -> Awaitable[Any]:
        """The recorded call of ``tool`` with ``args`` for the agent tool call ``call``, at its
        reserved position (or the stage's next one, see :meth:`take`)."""
        position = self.take(call)
        return position.call(tool, **args) if position is not None else self._stage.call(tool, **args)
