"""A durable Pydantic AI agent: its model requests and tool calls are recorded Runlog calls.

Install with ``pip install "runlog[pydantic-ai-openai]"`` (Pydantic AI with its OpenAI provider), or
``pip install "runlog[pydantic-ai]"`` and the provider of your model (``"pydantic-ai-slim[anthropic]"``,
...). Inside an ``async def`` stage::

    durable = RunlogAgent(agent, name="support")

    @wf.stage("answer")
    async def answer(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        result = await durable.run(ctx, ctx.params["question"])
        return {"answer": result.output}

Built like Pydantic AI's own durable-execution integrations (Temporal, DBOS, Prefect), on its
public extension points only: a :class:`~pydantic_ai.models.wrapper.WrapperModel` whose
``request`` is a recorded call, and a :class:`~pydantic_ai.toolsets.WrapperToolset` around each of
the agent's toolsets whose ``call_tool`` is a recorded call, installed for one run with
``agent.override(model=..., toolsets=..., tools=[])``.

* **Model requests.** Each request is a call of the Runlog tool ``pydantic_ai.model.<name>``
  (``SAFE`` by default, or ``IDEMPOTENT``): its arguments are the model, the messages (through
  Pydantic AI's ``ModelMessagesTypeAdapter``), the model settings and the request parameters as
  JSON; its result is the ``ModelResponse`` as JSON. The messages and the request parameters are
  stored by reference (``Tool.args_by_ref``): each message once, content-addressed, the call's
  recorded arguments naming them by hash, so a conversation of ``n`` turns stores its messages
  once, not ``n`` times (:func:`runlog.producers.load_args` reads a request back whole); the request hash
  is over the whole request, as before. On resume a recorded turn is read back and the model is
  not called. Fields that change on every run and are not the request
  (``timestamp``, ``run_id``, ``conversation_id`` of messages and parts, and tool call ids Pydantic
  AI generated, ``pyd_ai_...``) are left out of the recorded arguments, so the determinism guard
  compares what was asked: a request at a recorded position that is not the recorded request (a
  different prompt, history, tool set or model) raises :class:`~runlog.schemas.errors.Diverged` and the
  run blocks.
* **Usage.** Each model request records what its response's ``RequestUsage`` says it used (input,
  output, cache read and cache write tokens) with its result (``RunEvent.usage``), the model named
  ``"<system>:<model_name>"``, and the cost the runner's price table gives (``App.of(...,
  prices={"gpt-5.2": Price(input=..., output=...)})``, ``Runner.from_settings(...,
  prices=app.prices)``; no price, no cost). A request read back on resume records nothing again, so
  the projection's totals (``RunState.usage``) count each request once.
* **Tool calls.** Each call of an agent tool is a recorded call of a Runlog tool with the
  model's (validated) arguments as its arguments: ``pydantic_ai.tool.<name>.<tool>`` with
  ``tools_policy`` (``SAFE`` by default), or the Runlog :class:`~runlog.producers.Tool` that ``tools=``
  maps the agent tool's name to. A mapped tool keeps its whole declaration (replay policy,
  effect, target, delivery key, reconcile function, retry policy): what runs inside the recorded
  call is the agent's own tool function (the mapped tool's ``fn`` is not called, so declare it
  around that same function: ``tool("orders.save", ...)(save_order)``), which reads the
  call's :class:`~runlog.producers.CallInfo` (idempotency key, delivery key, fencing epoch) with
  :func:`current_call`. An effect tool returns a JSON object with a string ``"external_id"``.
  ``ModelRetry``, ``ToolFailed``, ``CallDeferred`` and ``ApprovalRequired`` raised by a tool are
  recorded as data and raised again on replay; an effect tool may not raise them (the effect
  either happened, with an external id, or the call failed): that fails the call.
* What the agent gets back is always the recorded JSON form (in the first run too), so a first
  run and its replay see the same values: a tool returning a Pydantic model hands the model's
  JSON object to the agent.

Rules of the road (the determinism guard enforces them):

* The tool calls of one model response run concurrently (Pydantic AI's ``parallel_ordered_events``
  mode: results reach the agent in the response's order once all have finished, and a failing call
  never cancels a sibling in the middle of its effect; a tool declared ``sequential=True`` still runs
  alone). Their positions are taken in the response's order when it arrives (recorded or new),
  before any of them runs, so the order they start or finish in never matters to the guard; a call
  the agent does not make (invalid arguments, a call after the output) leaves its position empty,
  the same on every re-run.
* Anything that feeds a request must be the same on a re-run: instructions and system prompts
  that read the clock or a random source diverge; read them in the stage with ``ctx.now()`` /
  ``ctx.random()`` and pass them in ``deps`` or the prompt.
* Do not run two durable agents concurrently in one stage (their calls would interleave); use
  one stage each, or run them one after the other.
* Out of scope: token counting before a request and message compaction (not recorded), output
  functions (``output_type=fn`` runs ``fn`` again on a re-run: keep it pure). An agent spans several
  stages by passing its messages on: return ``dump_messages(result.all_messages())`` from one
  stage and give ``load_messages(ctx.output_of(...)[...])`` as ``message_history`` in the next.
* Resume needs the mapped effect tools registered in the :class:`~runlog.producers.App`
  (``App.of(workflows, [*durable.tools(), ...], source)``): ``RECONCILE_FIRST`` intents are
  reconciled with the registered tool's reconcile function before the stage runs again.

Streaming (``run_stream``, ``iter`` with ``node.stream``, ``run(..., event_stream_handler=...)``): a
streaming model request is still one recorded call whose result is the whole ``ModelResponse``.
While it runs, its events go to the streams topic as they arrive (:mod:`runlog.producers.streams`: text
as ``DELTA`` records, other events as ``EVENT``, the whole response as ``FINAL``); the agent's own
consumers (the stream of ``run_stream``, ``node.stream``, the handler) get the events of the
recorded response once it is recorded, the same on a first run and a replay, as in Pydantic AI's
durable integrations. A recorded request is read back and not streamed again; an attempt that
follows one that died mid-stream (or a retry) starts with a ``SUPERSEDED`` record for the call.

Delegation as child runs (``delegates=``): in Pydantic AI an agent delegates to another from a tool
(``await researcher.run(...)`` inside the tool function). Name such a tool in
``RunlogAgent(agent, delegates={"research": durable_researcher})`` and call
``await durable_researcher.delegate(prompt)`` in it instead: the sub-agent then runs as a child run of
the stage's run (:meth:`~runlog.producers.AsyncStageContext.start_child`, workflow
``pydantic_ai.agent.<name>``, whose one stage runs ``durable_researcher.run(ctx, prompt)`` and records
its output), at the tool call's position; the parent's run waits for it holding no lease and no
thread, and the tool gets the child's output (validated to the sub-agent's output type) when the
stage runs again after the child's end. A crash inside the sub-agent resumes the sub-agent from its
own log; the parent's recorded model requests are read back, never asked again. The delegating
tool's own call is not recorded (the child is): its code runs again on each re-run of the stage, so
keep it deterministic, as stage code is. Opt-in per tool, since the tool's code is yours (what it
asks, what it does with the answer); a tool not named there that runs an agent keeps running it
inside its recorded call. Register the sub-agents' workflows in the App
(``App.of([wf, *durable.workflows()], durable.tools(), ...)``). The child gets only the prompt
(no ``deps``), and its usage is its own, rolled up to the parent's totals when its outcome is
recorded (pass no ``usage=ctx.usage``: the SDK's usage of the parent run does not include it).

Anything that is not JSON data (arguments, results, settings, tool metadata) raises
:class:`~runlog.schemas.errors.WorkflowDefinitionError` naming it.
"""

from __future__ import annotations

try:
    import pydantic_ai as _pydantic_ai  # noqa: F401
except ImportError as _err:  # pragma: no cover - exercised without the extra installed
    raise ImportError('runlog.producers.pydantic_ai needs Pydantic AI: '
                      'pip install "runlog[pydantic-ai]" (with a model provider: '
                      '"runlog[pydantic-ai-openai]", or "pydantic-ai-slim[<provider>]")'
                      ) from _err

import dataclasses
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Generic

from pydantic import PydanticSchemaGenerationError, TypeAdapter
from pydantic_ai import (
    ApprovalRequired,
    CallDeferred,
    DeferredToolResults,
    ModelRetry,
    ToolFailed,
    WrapperToolset,
)
from pydantic_ai.agent import AbstractAgent, AgentRun, AgentRunResult, EventStreamHandler
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.models import (
    CompletedStreamedResponse,
    KnownModelName,
    Model,
    ModelRequestParameters,
    StreamedResponse,
    infer_model,
)
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.output import OutputDataT
from pydantic_ai.result import StreamedRunResult
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import AgentDepsT, RunContext
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool
from pydantic_ai.usage import UsageLimits
from pydantic_core import to_jsonable_python

from runlog.producers.calls._keys import canonical_json
from runlog.producers.calls._replay_hook import model_override
from runlog.producers.define._tools import CallInfo, RetryPolicy, Tool
from runlog.producers.define._workflow import Workflow
from runlog.producers.integrations._children import ChildAgent, agent_workflow, run_child, workflows_of
from runlog.producers.integrations._core import DurableAgent, Positions, model_call
from runlog.producers.integrations._pydantic_ai_call import (
    CALL,
    RETRYABLE_MODEL_ERRORS,
    calling,
    current_call,
)
from runlog.producers.integrations._pydantic_ai_json import (
    decode_response,
    decode_result,
    dump_messages,
    encode_response,
    encode_result,
    encode_signal,
    jsonable,
    load_messages,
    request_args,
)
from runlog.producers.integrations._pydantic_ai_positions import call_keys, pending_calls
from runlog.producers.integrations._pydantic_ai_stream import StreamedTools, streamed_request
from runlog.producers.integrations._pydantic_ai_usage import usage_reader
from runlog.producers.streams import StreamWriter, default_stream_writer
from runlog.schemas import ReplayPolicy
from runlog.schemas.errors import TerminalToolError, WorkflowDefinitionError
from runlog.schemas.settings import Settings

if TYPE_CHECKING:
    from runlog.producers import AsyncStageContext, CallPosition

__all__ = ["RunlogAgent", "current_call", "dump_messages", "load_messages"]

# -- the model and the toolsets -------------------------------------------------------------------


class _RunlogModel(WrapperModel):
    """The agent's model for one durable run: each ``request`` is a recorded Runlog call."""

    def __init__(self, wrapped: Model, durable: RunlogAgent[Any, Any], stage: AsyncStageContext,
                 positions: Positions | None = None, streaming: StreamedTools | None = None) -> None:
        super().__init__(wrapped)
        self._durable = durable
        self._stage = stage
        self._positions = positions or Positions(stage)
        self._streaming = streaming or StreamedTools()

    async def request(self, messages: list[ModelMessage], model_settings: ModelSettings | None,
                      model_request_parameters: ModelRequestParameters) -> ModelResponse:
        wrapped = self.wrapped

        async def run(call: CallInfo) -> ModelResponse:
            return await wrapped.request(messages, model_settings, model_request_parameters)

        return await self._recorded(run, messages, model_settings, model_request_parameters)

    async def _recorded(self, run: Callable[[CallInfo], Awaitable[ModelResponse]],
                        messages: list[ModelMessage], model_settings: ModelSettings | None,
                        model_request_parameters: ModelRequestParameters) -> ModelResponse:
        """The request as a recorded call whose function is ``run`` (a response read back on resume)."""
        args = request_args(self.wrapped, messages, model_settings, model_request_parameters)
        model_tool = model_call(self._durable.model_tool, run, current=CALL, retryable=RETRYABLE_MODEL_ERRORS,
                                encode=encode_response, usage=usage_reader(self.wrapped))
        recorded = await self._stage.call(model_tool, **args)
        response = decode_response(recorded)
        names = {t.name for t in model_request_parameters.function_tools}  # not output tools
        self._positions.reserve(call_keys([p for p in response.parts
                                           if isinstance(p, ToolCallPart) and p.tool_name in names]))
        return response

    @asynccontextmanager
    async def request_stream(self, messages: list[ModelMessage], model_settings: ModelSettings | None,
                             model_request_parameters: ModelRequestParameters,
                             run_context: RunContext[Any] | None = None) -> AsyncGenerator[StreamedResponse]:
        stage = self._stage
        self._streaming.on = True  # the run's tool calls stream from now on
        run = streamed_request(self.wrapped, lambda: self._durable.stream_writer(stage), stage, messages,
                               model_settings, model_request_parameters, run_context, encode_response)
        response = await self._recorded(run, messages, model_settings, model_request_parameters)
        yield CompletedStreamedResponse(response, model_request_parameters=model_request_parameters,
                                        replay_events=True)


@dataclasses.dataclass
class _RunlogToolset(WrapperToolset[AgentDepsT]):
    """One of the agent's toolsets for one durable run: each ``call_tool`` is a recorded call."""

    durable: RunlogAgent[Any, Any] = dataclasses.field(kw_only=True)
    stage: AsyncStageContext = dataclasses.field(kw_only=True)
    positions: Positions = dataclasses.field(kw_only=True)
    streaming: StreamedTools = dataclasses.field(kw_only=True, default_factory=StreamedTools)

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[AgentDepsT],
                        tool: ToolsetTool[AgentDepsT]) -> Any:
        sub = self.durable.delegates.get(name)
        if sub is not None:  # a delegating tool: unrecorded, its sub-agent run is the child run
            position = self.positions.take((ctx.tool_call_id, name))
            token = _DELEGATING.set(_Delegation(sub, self.stage, position))
            try:
                return await self.wrapped.call_tool(name, tool_args, ctx, tool)
            finally:
                _DELEGATING.reset(token)
        spec = self.durable.tool_for(name)
        args = jsonable(lambda: to_jsonable_python(tool_args), f"the arguments of tool {name!r}")
        wrapped = self.wrapped

        async def fn(call: CallInfo, **_: Any) -> Any:
            streamed = self.streaming.begin(self.durable.stream_writer(self.stage), self.stage, call, name,
                                            ctx.tool_call_id, args) if self.streaming.on else None
            with calling(call):
                try:
                    result = await wrapped.call_tool(name, tool_args, ctx, tool)
                except (ModelRetry, ToolFailed, CallDeferred, ApprovalRequired) as signal:
                    if spec.effect:
                        raise TerminalToolError(
                            f"effect tool {spec.name!r} (agent tool {name!r}) raised "
                            f"{type(signal).__name__}: an effect tool either does its effect and returns "
                            "{'external_id': ...} or fails; check the model's arguments in the tool's "
                            "args_validator, which runs before the recorded call",
                            kind=type(signal).__name__) from signal
                    encoded = encode_signal(signal)
                else:
                    encoded = encode_result(result, name, effect=spec.effect)
            if streamed is not None:
                streamed.final(encoded)
            return encoded

        recorded = await self.positions.call((ctx.tool_call_id, name), dataclasses.replace(spec, fn=fn), args)
        # the recorded JSON form (object keys sorted, as a re-run or a replay reads it back), in the
        # first run too: the model sees the same tool return, byte for byte, every time
        return decode_result(json.loads(canonical_json(recorded)))


@dataclasses.dataclass
class _Delegation:
    """The delegating tool call under way: the sub-agent it may run, the stage, its call position."""

    sub: RunlogAgent[Any, Any]
    stage: AsyncStageContext
    position: CallPosition | None
    used: bool = False


_DELEGATING: ContextVar[_Delegation | None] = ContextVar("runlog_pydantic_ai_delegation", default=None)


# -- the durable agent -----------------------------------------------------------------------------


class RunlogAgent(DurableAgent, ChildAgent, Generic[AgentDepsT, OutputDataT]):
    """A Pydantic AI agent whose runs inside async Runlog stages are recorded call by call.

    Args:
        agent: the agent (its toolsets, instructions, output type and settings are used as they are).
        name: names the Runlog tools of this agent (default: ``agent.name``; required, without '/').
        model: the model to use (default: the agent's model): a ``Model`` or a model name.
        model_policy: replay policy of the model requests, ``SAFE`` (default) or ``IDEMPOTENT``
            (the call then carries an idempotency key, :func:`current_call` inside the request).
        model_retry: retry policy of a model request, applied to rate-limit, unavailable, server
            and connection errors of the model (others fail the call at once).
        tools: agent tool name -> the Runlog :class:`~runlog.producers.Tool` its calls are recorded as
            (replay policy, effect, target, delivery key, reconcile function, retry policy).
        tools_policy: replay policy of every other agent tool, ``SAFE`` (default) or ``IDEMPOTENT``.
        stream: where streamed output is written (default:
        :func:`runlog.producers.streams.default_stream_writer`).
        delegates: agent tool name -> the durable sub-agent that tool delegates to with
            :meth:`delegate`, run as a child run (see "Delegation as child runs").

    Raises:
        WorkflowDefinitionError: no name, a name with '/', a policy that needs a declaration, a
            delegate that is no RunlogAgent.
    """

    def __init__(self, agent: AbstractAgent[AgentDepsT, OutputDataT], *, name: str | None = None,
                 model: Model | KnownModelName | str | None = None,
                 model_policy: ReplayPolicy = ReplayPolicy.SAFE, model_retry: RetryPolicy | None = None,
                 tools: Mapping[str, Tool] | None = None,
                 tools_policy: ReplayPolicy = ReplayPolicy.SAFE, stream: StreamWriter | None = None,
                 delegates: Mapping[str, RunlogAgent[Any, Any]] | None = None) -> None:
        self.agent = agent
        self._stream = stream
        super().__init__("pydantic_ai", name or agent.name or "",
                         name_hint="RunlogAgent(agent, name=...) or Agent(name=...)",
                         model_policy=model_policy, model_retry=model_retry,
                         model_args_by_ref=("messages", "parameters"), tools=tools, tools_policy=tools_policy)
        self._model = model
        self.delegates: dict[str, RunlogAgent[Any, Any]] = dict(delegates or {})
        """Agent tool name -> the sub-agent it delegates to as a child run."""
        for tool_name, sub in self.delegates.items():
            if not isinstance(sub, RunlogAgent):
                raise WorkflowDefinitionError(f"RunlogAgent {self.name!r}: delegates[{tool_name!r}] must be "
                                              f"a RunlogAgent, got {type(sub).__name__}")
        self._workflow: Workflow | None = None

    # -- delegation as child runs ---------------------------------------------------------------------

    @property
    def workflow(self) -> Workflow:
        """The workflow of this agent's runs as a child run (``pydantic_ai.agent.<name>``)."""
        if self._workflow is None:
            self._workflow = agent_workflow("pydantic_ai", self.name, self._as_child)
        return self._workflow

    def child_agents(self) -> list[RunlogAgent[Any, Any]]:
        """The durable agents this agent's tools delegate to."""
        return list(self.delegates.values())

    def workflows(self) -> list[Workflow]:
        """The child workflows of this agent's delegates (and theirs), for ``App.of``."""
        return workflows_of(self)

    def tools(self) -> list[Tool]:
        """The Runlog tools declared for this agent and its delegates (see ``DurableAgent.tools``)."""
        out: dict[str, Tool] = {t.name: t for t in super().tools()}
        for wf_agent in self._all_delegates():
            for t in DurableAgent.tools(wf_agent):
                out.setdefault(t.name, t)
        return list(out.values())

    def _all_delegates(self) -> list[RunlogAgent[Any, Any]]:
        out: list[RunlogAgent[Any, Any]] = []
        todo, seen = list(self.delegates.values()), {id(self)}
        while todo:
            a = todo.pop(0)
            if id(a) not in seen:
                seen.add(id(a))
                out.append(a)
                todo += a.delegates.values()
        return out

    async def _as_child(self, ctx: AsyncStageContext, params: Mapping[str, Any]) -> dict[str, Any]:
        result = await self.run(ctx, params["prompt"])
        return {"output": jsonable(lambda: to_jsonable_python(result.output), "the sub-agent's output")}

    async def delegate(self, prompt: str) -> Any:
        """Run this agent on ``prompt`` as a child run of the stage's run, from a tool of a durable
        agent that names it in ``delegates=``, and return its output (see "Delegation as child
        runs"). Once per tool call.

        Raises:
            WorkflowDefinitionError: not inside such a tool call, the tool delegates to another
                agent, or a second delegation in one tool call.
            RunFailed, RunCancelled, ResumeBlocked: the child ended so.
        """
        d = _DELEGATING.get()
        if d is None or d.sub is not self:
            raise WorkflowDefinitionError(
                f"RunlogAgent {self.name!r}: delegate() runs inside a tool that a durable agent names in "
                f"RunlogAgent(..., delegates={{'<tool>': <this agent>}})")
        if d.used:
            raise WorkflowDefinitionError(f"RunlogAgent {self.name!r}: one delegate() per tool call")
        d.used = True
        out = await run_child(d.stage, d.position, self.workflow, {"prompt": prompt})
        return _typed(self.agent, out.get("output"))

    def _wrapped_model(self, run_id: str) -> Model:
        model = model_override(run_id) or (self._model if self._model is not None else self.agent.model)
        if model is None:
            raise WorkflowDefinitionError(f"RunlogAgent {self.name!r}: the agent has no model; pass "
                                          "RunlogAgent(agent, model=...)")
        return infer_model(model)

    @contextmanager
    def _installed(self, ctx: AsyncStageContext, kwargs: dict[str, Any]) -> Iterator[None]:
        """This agent's model and toolsets made recorded calls of ``ctx`` for one run; ``kwargs``
        (those of ``Agent.run``, ``toolsets`` among them) keep what the agent takes."""
        toolsets = kwargs.pop("toolsets", None) or ()
        positions = Positions(ctx)  # calls pending in the history are made before any request
        positions.reserve(call_keys(pending_calls(kwargs.get("message_history"),
                                                  kwargs.get("deferred_tool_results"))))
        streaming = StreamedTools()
        model = _RunlogModel(self._wrapped_model(ctx.run_id), self, ctx, positions, streaming)
        wrapped = [_RunlogToolset(ts, durable=self, stage=ctx, positions=positions, streaming=streaming)
                   for ts in [*self.agent.toolsets, *toolsets]]
        for key in [k for k, v in kwargs.items() if v is None]:
            del kwargs[key]
        kwargs["infer_name"] = False
        with self.agent.override(model=model, toolsets=wrapped, tools=[]), \
                self.agent.parallel_tool_call_execution_mode("parallel_ordered_events"):
            yield

    async def run(self, ctx: AsyncStageContext, user_prompt: str | Sequence[Any] | None = None, *,
                  output_type: Any = None, message_history: Sequence[ModelMessage] | None = None,
                  deferred_tool_results: DeferredToolResults | None = None, deps: Any = None,
                  model_settings: ModelSettings | None = None, usage_limits: UsageLimits | None = None,
                  instructions: Any = None, metadata: Any = None,
                  toolsets: Sequence[AbstractToolset[AgentDepsT]] | None = None,
                  event_stream_handler: EventStreamHandler[AgentDepsT] | None = None) -> AgentRunResult[Any]:
        """Run the agent to its output inside an async stage; every model request and tool call
        is a recorded call of ``ctx`` (see the module docstring). The arguments are those of
        ``Agent.run``; ``toolsets`` are added to the agent's and recorded the same way. With an
        ``event_stream_handler`` the model requests stream (see "Streaming")."""
        kwargs = dict(output_type=output_type, message_history=message_history, deps=deps,
                      deferred_tool_results=deferred_tool_results, model_settings=model_settings,
                      usage_limits=usage_limits, instructions=instructions, metadata=metadata,
                      toolsets=toolsets, event_stream_handler=event_stream_handler)
        with self._installed(ctx, kwargs):
            result: AgentRunResult[Any] = await self.agent.run(user_prompt, **kwargs)
        return result

    @asynccontextmanager
    async def run_stream(self, ctx: AsyncStageContext, user_prompt: str | Sequence[Any] | None = None,
                         **kwargs: Any) -> AsyncIterator[StreamedRunResult[Any, Any]]:
        """``Agent.run_stream`` inside an async stage (the arguments of :meth:`run`); see "Streaming"."""
        with self._installed(ctx, kwargs):
            async with self.agent.run_stream(user_prompt, **kwargs) as streamed:
                yield streamed

    @asynccontextmanager
    async def iter(self, ctx: AsyncStageContext, user_prompt: str | Sequence[Any] | None = None,
                   **kwargs: Any) -> AsyncIterator[AgentRun[Any, Any]]:
        """``Agent.iter`` inside an async stage (the arguments of :meth:`run`); a model request
        node's ``node.stream(...)`` streams (see "Streaming")."""
        with self._installed(ctx, kwargs):
            async with self.agent.iter(user_prompt, **kwargs) as agent_run:
                yield agent_run

    def stream_writer(self, ctx: AsyncStageContext) -> StreamWriter:
        """The writer of this agent's streamed output in ``ctx``'s run: ``stream=``, or the process's
        for the settings of the run's writer (:func:`runlog.producers.streams.default_stream_writer`)."""
        run_writer = getattr(ctx.session, "writer", None)
        settings = getattr(run_writer, "settings", None)
        writer = self._stream or default_stream_writer(settings if isinstance(settings, Settings) else None)
        writer.count_in(getattr(run_writer, "metrics", None))  # runlog_writer_stream_records_total
        return writer


def _typed(agent: AbstractAgent[Any, Any], data: Any) -> Any:
    """A child's recorded output as the sub-agent's output type (the JSON as it is when the type is
    not one pydantic can validate to)."""
    output_type = getattr(agent, "output_type", None)
    if output_type is None or output_type is str:
        return data
    try:
        return TypeAdapter(output_type).validate_python(data)
    except (TypeError, PydanticSchemaGenerationError):  # an output function or spec: JSON as recorded
        return data
