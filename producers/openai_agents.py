"""A durable OpenAI Agents SDK agent: its model calls and tool calls are recorded Runlog calls.

Install with ``pip install "runlog[openai-agents]"``. Inside an ``async def`` stage::

    durable = RunlogAgent(agent, tools={"save_order": save_tool})

    @wf.stage("answer")
    async def answer(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        result = await durable.run(ctx, ctx.params["question"])
        return {"answer": result.final_output}

Built on the SDK's public extension points, as its Temporal integration is: a
:class:`~agents.models.interface.Model` whose ``get_response`` is a recorded call (given to
``Runner.run`` as ``RunConfig(model=...)``), and each :class:`~agents.FunctionTool` of the agent
with an ``on_invoke_tool`` that is a recorded call (the agent cloned for the run with those tools).

* **Model calls.** Each call is a call of the Runlog tool ``openai_agents.model.<name>`` (``SAFE``
  by default, or ``IDEMPOTENT``): its arguments are the model's name, the instructions, the input
  items, the model settings, the tools, the output schema, the handoffs, the previous response
  and conversation ids and the prompt, as JSON; the input items and the tools are stored by
  reference (:attr:`runlog.producers.Tool.args_by_ref`: a conversation's items once, not once per
  turn). Its result is the ``ModelResponse``: its output items (the ``openai`` package's pydantic
  models) in their wire form, its usage and ids. On resume a recorded call is read back and the
  model is not called; a call at a recorded position that asks something else (another prompt,
  history, tool set, model or settings) raises :class:`~runlog.schemas.errors.Diverged` and the run
  blocks. The response's usage (input, output, cached and cache-write tokens) is recorded with
  the call's ``TOOL_RESULT`` under the model's name, priced by the App's price table.
* **Tool calls.** Each call of a function tool is a recorded call of a Runlog tool whose arguments
  are the model's JSON arguments: ``openai_agents.tool.<name>.<tool>`` with ``tools_policy``
  (``SAFE`` by default), or the Runlog :class:`~runlog.producers.Tool` that ``tools=`` maps the function
  tool's name to. A mapped tool keeps its whole declaration (replay policy, effect, target,
  delivery key, reconcile function, retry policy); what runs inside the recorded call is the
  function tool itself (the mapped tool's ``fn`` is not called, so declare it around the same
  function), which reads the call's :class:`~runlog.producers.CallInfo` (delivery key, idempotency key,
  fencing epoch) with :func:`current_call`. An effect tool returns a JSON object with a string
  ``"external_id"``; declare its function tool with ``failure_error_function=None`` so that its
  failure fails the call (the SDK's default turns an exception into a message for the model,
  which an effect tool may not answer with). Arguments that are not a JSON object are answered
  by the function tool itself, unrecorded (the same answer on every re-run).
* What the agent gets back is always the recorded JSON form (in the first run too), so a first run
  and its replay see the same values.
* **Handoffs run as child runs.** When the model hands off (a handoff of ``agent.handoffs``, an
  ``Agent`` or a ``handoff(...)``), the agent handed off to runs as a child run of the stage's run
  (:meth:`~runlog.producers.AsyncStageContext.start_child`): workflow
  ``openai_agents.agent.<name>``, whose one stage runs that agent durably (a :class:`RunlogAgent` of
  it: ``handoffs=`` maps an agent's name to the one to use, else one with the defaults and this
  agent's ``run_config``) on the conversation the SDK hands it (after the handoff's input filter), and
  records its final output. The parent's run waits meanwhile, holding no lease and no thread; the
  child's end wakes it, the stage runs again (its recorded model calls read back, the child found,
  not started again) and the SDK gets the child's final output as the handed-off agent's answer: the
  run's ``final_output`` is the sub-agent's. A crash inside the sub-agent resumes the sub-agent from
  its own log, not the parent's stage. This is the default because a handoff gives the rest of the
  conversation to another agent, which is what a child run is: the sub-agent's calls, its budget and
  its audit are its own, and it may run on another member. Register the sub-agents' workflows in the
  App (``App.of([wf, *durable.workflows()], durable.tools(), ...)``). The handoff's ``on_handoff``
  runs again on each re-run of the parent's stage (keep it pure); the child gets no local
  ``context`` object (only the conversation), and its model calls' usage is the child's (rolled up
  to the parent's totals when its outcome is recorded, not in the SDK's ``result.context_wrapper.usage``).
* An agent given as a tool (``Agent.as_tool``) runs inside the outer agent's recorded tool call, on
  its own model (or the run config's): its model calls are part of that call. With
  ``agent_tools="child"`` it runs as a child run instead (as a handoff does): the tool's ``input``
  (or its JSON arguments, for a tool with structured ``parameters``) is the sub-agent's input and the
  tool's output is its final output as text (a ``custom_output_extractor`` is not used). Opt-in,
  because it changes where a run records the sub-agent's calls: a run recorded with agent tools
  inline, resumed on code with ``agent_tools="child"``, diverges at that call.

Rules of the road:

* The function tool calls of one model response run concurrently, as the SDK runs them; their
  positions are taken in the response's order when it arrives (recorded or new), so the order they
  finish in never matters to the determinism guard. The SDK cancels the others when one fails;
  their recorded calls are shielded and finish (an effect records its result) before the run raises.
* Anything that feeds a model call must be the same on a re-run (instructions, the input, tool
  definitions): read the clock or a random source in the stage (``ctx.now()``, ``ctx.random()``)
  and pass the value in the input or the context.
* Out of scope, refused with :class:`~runlog.schemas.errors.WorkflowDefinitionError`: streaming
  (``Runner.run_streamed``), MCP servers, local tools other than function tools (computer,
  shell, apply-patch, custom tools), tools that need approval or have a timeout
  (``function_tool(timeout=...)``), and the SDK's own model retries (``ModelSettings.retry``: use
  ``model_retry``). Guardrails run again on a re-run (keep them pure). An agent spans several
  stages by passing its items on: return ``result.to_input_list()`` from one stage and give it
  (with the new message appended) as the input in the next.
* Resume needs the mapped effect tools registered in the :class:`~runlog.producers.App`
  (``App.of(workflows, [*durable.tools(), ...], source)``): ``RECONCILE_FIRST`` intents are
  reconciled with the registered tool's reconcile function before the stage runs again.
"""

from __future__ import annotations

try:
    import agents as _agents  # noqa: F401
except ImportError as _err:  # pragma: no cover - exercised without the extra installed
    raise ImportError('runlog.producers.openai_agents needs the OpenAI Agents SDK: '
                      'pip install "runlog[openai-agents]"') from _err

import dataclasses
import inspect
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from agents import (
    Agent,
    CodeInterpreterTool,
    FileSearchTool,
    FunctionTool,
    HostedMCPTool,
    ImageGenerationTool,
    ModelSettings,
    RunConfig,
    Runner,
    RunResult,
    ToolSearchTool,
    TResponseInputItem,
    WebSearchTool,
)
from agents import Tool as AgentTool
from agents.handoffs import Handoff, handoff
from agents.models.interface import Model
from agents.run import DEFAULT_MAX_TURNS
from agents.tool_context import ToolContext

from runlog.producers.calls._replay_hook import model_override
from runlog.producers.define._tools import CallInfo, RetryPolicy, Tool
from runlog.producers.define._workflow import Workflow
from runlog.producers.integrations._children import ChildAgent, agent_workflow, workflows_of
from runlog.producers.integrations._core import DurableAgent
from runlog.producers.integrations._openai_agents_children import child_output, handed_off, run_agent_tool
from runlog.producers.integrations._openai_agents_json import SDK_ERROR_ATTR, decode_result, encode_result
from runlog.producers.integrations._openai_agents_run import Run, RunlogModel, calling, current_call
from runlog.schemas import ReplayPolicy
from runlog.schemas.errors import TerminalToolError, WorkflowDefinitionError

try:
    from agents.run_internal import turn_preparation as _turn_preparation
except ImportError:  # pragma: no cover - the SDK moved its resolver: the agent's own settings
    _turn_preparation = None  # type: ignore[assignment]
_resolve_settings: Callable[..., ModelSettings] | None = getattr(_turn_preparation, "get_model_settings",
                                                                 None)
"""The SDK's own resolver of a turn's model settings: ``(agent, run_config)`` up to openai-agents 0.24,
``(agent, run_config, model, *, has_tools=...)`` from 0.25 (the resolved model's defaults)."""
_RESOLVER_TAKES_MODEL = (_resolve_settings is not None
                         and "model" in inspect.signature(_resolve_settings).parameters)

if TYPE_CHECKING:
    from runlog.producers import AsyncStageContext

__all__ = ["RunlogAgent", "current_call"]

_HOSTED_TOOLS = (CodeInterpreterTool, FileSearchTool, HostedMCPTool, ImageGenerationTool, ToolSearchTool,
                 WebSearchTool)
"""Tools the model's provider runs: their calls and results are part of the recorded response."""

# -- the durable agent -------------------------------------------------------------------------


class RunlogAgent(DurableAgent, ChildAgent):
    """An OpenAI Agents SDK agent whose runs inside async Runlog stages are recorded call by call.

    Args:
        agent: the agent (its instructions, function tools, output type, settings and guardrails
            are used as they are).
        name: names the Runlog tools of this agent (default: ``agent.name``; without '/').
        model: the model to use (default: the run config's, else the agent's, else the SDK's
            default): a ``Model`` or a model name the run config's ``model_provider`` resolves.
        model_name: how the model's calls name it in their recorded arguments and usage (default:
            the model name given, or the ``Model``'s ``model`` attribute).
        model_policy: replay policy of the model calls, ``SAFE`` (default) or ``IDEMPOTENT``.
        model_retry: retry policy of a model call, applied to the model's rate-limit, connection
            and server errors (others fail the call at once).
        tools: function tool name -> the Runlog :class:`~runlog.producers.Tool` its calls are recorded as.
        tools_policy: replay policy of every other function tool, ``SAFE`` (default) or ``IDEMPOTENT``.
        handoffs: agent name -> the :class:`RunlogAgent` a handoff to that agent runs as a child run
            (default: ``RunlogAgent(agent, run_config=run_config)``).
        agent_tools: ``"inline"`` (default: an ``Agent.as_tool`` runs inside the tool's recorded call)
            or ``"child"`` (it runs as a child run, as a handoff does).
        run_config: the run config of runs not given one, and of this agent's runs as a child run.

    Raises:
        WorkflowDefinitionError: a name with '/', a policy that needs a declaration, a mapping that
            is not a Runlog Tool or RunlogAgent, an unknown ``agent_tools``.
    """

    def __init__(self, agent: Agent[Any], *, name: str | None = None, model: Model | str | None = None,
                 model_name: str | None = None, model_policy: ReplayPolicy = ReplayPolicy.SAFE,
                 model_retry: RetryPolicy | None = None, tools: Mapping[str, Tool] | None = None,
                 tools_policy: ReplayPolicy = ReplayPolicy.SAFE,
                 handoffs: Mapping[str, RunlogAgent] | None = None, agent_tools: str = "inline",
                 run_config: RunConfig | None = None) -> None:
        self.agent = agent
        super().__init__("openai_agents", name or agent.name,
                         name_hint=f"got {name or agent.name!r}; RunlogAgent(agent, name=...)",
                         model_policy=model_policy, model_retry=model_retry,
                         model_args_by_ref=("input", "tools"), tools=tools, tools_policy=tools_policy)
        self._model = model
        self._model_name = model_name
        if agent_tools not in ("inline", "child"):
            raise WorkflowDefinitionError(f"RunlogAgent {self.name!r}: agent_tools must be 'inline' or "
                                          f"'child', got {agent_tools!r}")
        self.agent_tools = agent_tools
        self.run_config = run_config
        self._subs: dict[str, RunlogAgent] = {self.agent.name: self}  # sub-agents by agent name, shared
        for agent_name, sub in (handoffs or {}).items():
            if not isinstance(sub, RunlogAgent):
                raise WorkflowDefinitionError(f"RunlogAgent {self.name!r}: handoffs[{agent_name!r}] must be "
                                              f"a RunlogAgent, got {type(sub).__name__}")
            self._subs[agent_name] = sub
        self._workflow: Workflow | None = None

    # -- sub-agents as child runs --------------------------------------------------------------------

    def sub_agent(self, agent: Agent[Any]) -> RunlogAgent:
        """The durable agent a handoff (or a child agent tool) to ``agent`` runs as: the one
        ``handoffs=`` gives for its name, else one made once with this agent's defaults."""
        found = self._subs.get(agent.name)
        if found is None:
            found = RunlogAgent(agent, run_config=self.run_config, agent_tools=self.agent_tools)
            found._subs = self._subs  # one agent per name across the tree (handoffs back and forth)
            self._subs[agent.name] = found
        return found

    def _sub_agents(self) -> list[Agent[Any]]:
        found: list[Agent[Any]] = []
        for h in self.agent.handoffs:
            target = h if isinstance(h, Agent) else (h._agent_ref() if h._agent_ref is not None else None)
            if isinstance(target, Agent):
                found.append(target)
            elif isinstance(h, Handoff) and h.agent_name in self._subs:
                found.append(self._subs[h.agent_name].agent)
        if self.agent_tools == "child":
            found += [t._agent_instance for t in self.agent.tools if isinstance(t, FunctionTool)
                      and t._is_agent_tool and isinstance(t._agent_instance, Agent)]
        return found

    def child_agents(self) -> list[RunlogAgent]:
        """The durable agents this agent's handoffs (and child agent tools) run as."""
        return [self.sub_agent(a) for a in self._sub_agents()]

    @property
    def workflow(self) -> Workflow:
        """The workflow of this agent's runs as a child run (``openai_agents.agent.<name>``)."""
        if self._workflow is None:
            self._workflow = agent_workflow("openai_agents", self.name, self._as_child)
        return self._workflow

    def workflows(self) -> list[Workflow]:
        """The child workflows of this agent's sub-agents (and theirs), for ``App.of``."""
        return workflows_of(self)

    def tools(self) -> list[Tool]:
        """The Runlog tools declared for this agent and its sub-agents (see ``DurableAgent.tools``)."""
        out: dict[str, Tool] = {t.name: t for t in super().tools()}
        for sub in workflows_of_agents(self):
            for t in DurableAgent.tools(sub):
                out.setdefault(t.name, t)
        return list(out.values())

    async def _as_child(self, ctx: AsyncStageContext, params: Mapping[str, Any]) -> dict[str, Any]:
        turns = int(params.get("max_turns", DEFAULT_MAX_TURNS))
        result = await self.run(ctx, params["input"], max_turns=turns)
        return child_output(result.final_output)

    def _resolved_model(self, config: RunConfig, run_id: str) -> tuple[Model, str]:
        override = model_override(run_id)  # `runlog replay --model`: the replayed run's agents use it
        chosen = override if override is not None else self._model if self._model is not None else (
            config.model if config.model is not None else self.agent.model)
        model = chosen if isinstance(chosen, Model) else config.model_provider.get_model(chosen)
        attr = getattr(model, "model", None)
        label = (override if override is not None else self._model_name) \
            or (chosen if isinstance(chosen, str) else None) \
            or (attr if isinstance(attr, str) else type(model).__name__)
        return model, label

    def _check(self) -> None:
        a = self.agent
        if a.mcp_servers:
            raise WorkflowDefinitionError(f"RunlogAgent {self.name!r}: MCP servers (mcp_servers) are not "
                                          "supported; give the agent function tools")
        for h in a.handoffs:
            if isinstance(h, Handoff) and h._agent_ref is None and h.agent_name not in self._subs:
                raise WorkflowDefinitionError(
                    f"RunlogAgent {self.name!r}: the handoff to {h.agent_name!r} was not made with "
                    "handoff(agent); name its durable agent: "
                    f"RunlogAgent(..., handoffs={{{h.agent_name!r}: RunlogAgent(...)}})")
        for t in a.tools:
            if isinstance(t, _HOSTED_TOOLS):
                continue
            if not isinstance(t, FunctionTool):
                raise WorkflowDefinitionError(
                    f"RunlogAgent {self.name!r}: tool {t.name!r} is a {type(t).__name__}, which runs locally "
                    "and is not recorded; only function tools and the provider's hosted tools are supported")
            if t.timeout_seconds is not None:
                raise WorkflowDefinitionError(
                    f"RunlogAgent {self.name!r}: tool {t.name!r} has a timeout (function_tool(timeout=...)); "
                    "the SDK would answer the model with a timeout while the recorded call goes on to its "
                    "result, which a "
                    "replay hands back instead: time out inside the tool function (raise "
                    "RetryableToolError for the retry policy) or leave the timeout out")
            if t.needs_approval is not False:
                raise WorkflowDefinitionError(
                    f"RunlogAgent {self.name!r}: tool {t.name!r} needs approval, which interrupts the run "
                    "outside the log; wait for a person in a stage with ctx.wait_for(...) instead")

    def _durable_tool(self, t: AgentTool, run: Run) -> AgentTool:
        if not isinstance(t, FunctionTool):
            return t  # a hosted tool: the provider runs it inside the recorded model call
        if self.agent_tools == "child" and t._is_agent_tool and isinstance(t._agent_instance, Agent):
            return run_agent_tool(t, self.sub_agent(t._agent_instance), run)
        spec = self.tool_for(t.name)
        original = t.on_invoke_tool

        async def invoke(tool_ctx: ToolContext[Any], arguments: str) -> Any:
            try:
                args = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError:
                args = None
            if not isinstance(args, dict):  # the tool's own answer to arguments it cannot read
                return await original(tool_ctx, arguments)

            async def fn(call: CallInfo, **_: Any) -> Any:
                with calling(call):
                    result = await original(tool_ctx, arguments)
                if spec.effect and isinstance(result, str):
                    raise TerminalToolError(
                        f"effect tool {spec.name!r} (function tool {t.name!r}) answered with text "
                        f"({result[:200]!r}) instead of {{'external_id': ...}}: the SDK turns a tool's "
                        "exception into a message for the model; declare the function tool with "
                        "failure_error_function=None so its failure fails the call",
                        kind="EffectAnsweredText")
                if spec.effect:  # the record of the effect: a JSON object with "external_id"
                    return encode_result(result, t.name)
                return encode_result(result, t.name, sdk_error=bool(getattr(tool_ctx, SDK_ERROR_ATTR, False)))

            declared = dataclasses.replace(spec, fn=fn)
            recorded = await run.guard(run.call(declared, (tool_ctx.tool_call_id, t.name), args))
            return decode_result(recorded, tool_ctx)

        return dataclasses.replace(t, on_invoke_tool=invoke)

    def _durable_handoff(self, h: Agent[Any] | Handoff[Any, Any], run: Run) -> Handoff[Any, Any]:
        """The handoff ``h`` whose target runs as a child run (see the module docstring)."""
        made = h if isinstance(h, Handoff) else handoff(h)
        original = made.on_invoke_handoff
        subs = self

        async def invoke(context: Any, input_json: str) -> Agent[Any]:
            target = await original(context, input_json)  # the SDK's own work (on_handoff, input checks)
            sub = subs._subs.get(made.agent_name) or subs.sub_agent(target)
            return handed_off(target, sub, run)

        return dataclasses.replace(made, on_invoke_handoff=invoke)

    async def run(self, ctx: AsyncStageContext, input: str | list[TResponseInputItem], *,
                  context: Any = None, max_turns: int = DEFAULT_MAX_TURNS,
                  run_config: RunConfig | None = None,
                  previous_response_id: str | None = None, conversation_id: str | None = None) -> RunResult:
        """Run the agent to its final output inside an async stage (``Runner.run``); every model
        call and function tool call is a recorded call of ``ctx`` (see the module docstring)."""
        self._check()
        config = run_config or self.run_config or RunConfig()
        run = Run(ctx)
        model, label = self._resolved_model(config, ctx.run_id)
        durable_model = RunlogModel(model, label, self.name, self.model_tool, run)
        run.model = durable_model
        # the agent's own model is the durable one (an agent given as a tool keeps its own model); the
        # settings are those the SDK gives the model as named (a name's defaults, not a Model's none)
        settings = _sdk_settings(self.agent if self._model is None else self.agent.clone(model=self._model),
                                 config, model)
        durable_agent = self.agent.clone(model=durable_model,
                                         tools=[self._durable_tool(t, run) for t in self.agent.tools],
                                         handoffs=[self._durable_handoff(h, run)
                                                   for h in self.agent.handoffs])
        durable_agent.model_settings = settings  # set after: Agent() resets a model's default settings
        if config.model is not None:  # the run config's model wins over the agent's
            config = dataclasses.replace(config, model=durable_model)
        try:
            result = await Runner.run(durable_agent, input, context=context, max_turns=max_turns,
                                      run_config=config, previous_response_id=previous_response_id,
                                      conversation_id=conversation_id)
        except BaseException as err:
            await run.settle()  # a sibling of a failed tool call finishes its call (an effect under way)
            if run.error is not None and run.error is not err:
                raise run.error from None  # the recorded call's own error, not the SDK's wrapper
            raise
        await run.settle()
        if run.error is not None:  # a recorded call failed and the SDK went on: the stage fails
            raise run.error
        return result


def workflows_of_agents(root: RunlogAgent) -> list[RunlogAgent]:
    """Every sub-agent under ``root`` (handoffs, child agent tools, theirs), each once."""
    out: list[RunlogAgent] = []
    todo, seen = list(root.child_agents()), {id(root)}
    while todo:
        a = todo.pop(0)
        if id(a) not in seen:
            seen.add(id(a))
            out.append(a)
            todo += a.child_agents()
    return out


def _sdk_settings(agent: Agent[Any], config: RunConfig, model: Model) -> ModelSettings:
    """The model settings the SDK resolves for ``agent`` under ``config`` with ``model`` (its defaults
    for a model given by name, the agent's and the run config's settings over them)."""
    if _resolve_settings is None:  # pragma: no cover - an SDK without the resolver
        return agent.model_settings.resolve(config.model_settings)
    if _RESOLVER_TAKES_MODEL:
        return _resolve_settings(agent, config, model, has_tools=bool(agent.tools or agent.handoffs))
    return _resolve_settings(agent, config)

