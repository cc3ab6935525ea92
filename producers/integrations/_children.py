"""Sub-agents as child runs, whatever the agent framework: the workflow a durable agent runs in when
another agent hands off or delegates to it, and the step that starts it and reads its output.

A sub-agent run as a child run (:meth:`runlog.producers.AsyncStageContext.start_child`) is a run of
its own: workflow ``<integration>.agent.<name>`` (version ``"1"``), one ``async def`` stage
:data:`AGENT_STAGE` that runs the durable sub-agent on the parameters the parent gave (its model and
tool calls recorded on the child's log) and returns its output as JSON. So a crash inside the
sub-agent resumes the sub-agent from its own log, and the parent, waiting meanwhile with no lease and
no thread, is woken by its end and reads the recorded outcome back (a re-run of the parent's stage
reads its own recorded model calls back, and finds its child instead of starting a second one).

The child runs in whichever member of the App's resumer group takes it: the App must register the
sub-agent's workflow (``durable.workflows()``). Nothing but the parameters reaches it (no local
context object or dependencies of the parent's process).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from runlog.producers.define._workflow import Workflow

if TYPE_CHECKING:
    from runlog.producers import AsyncStageContext, CallPosition

__all__ = ["AGENT_STAGE", "ChildAgent", "agent_workflow", "child_workflow_name", "run_child", "workflows_of"]

AGENT_STAGE = "agent"
"""The one stage of a sub-agent's child workflow; its output is the sub-agent's output."""

_BAD = re.compile(r"[^A-Za-z0-9_.\-]")


def child_workflow_name(integration: str, name: str) -> str:
    """The workflow name of agent ``name``'s child runs (characters a workflow name cannot hold as ``_``)."""
    return f"{integration}.agent.{_BAD.sub('_', name)}"


def agent_workflow(integration: str, name: str,
                   run: Callable[[AsyncStageContext, Mapping[str, Any]], Awaitable[dict[str, Any]]],
                   ) -> Workflow:
    """The child workflow of agent ``name``: its stage :data:`AGENT_STAGE` returns ``run(ctx, params)``."""
    wf = Workflow(child_workflow_name(integration, name), version="1")

    async def agent(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return await run(ctx, ctx.params)

    wf.stage(AGENT_STAGE)(agent)
    return wf


async def run_child(stage: AsyncStageContext, position: CallPosition | None, workflow: Workflow,
                    params: Mapping[str, Any]) -> dict[str, Any]:
    """Start the child run of ``workflow`` at ``position`` (None: the stage's next one) and return its
    :data:`AGENT_STAGE` output once it has completed (the parent's run waits meanwhile, holding
    nothing: the stage runs again when the child has ended, and reads its outcome back).

    Raises:
        RunFailed, RunCancelled, ResumeBlocked: the child ended so (see ``ctx.start_child``).
    """
    handle = await (position.start_child(workflow, params) if position is not None
                    else stage.start_child(workflow, params))
    result = await handle
    out: dict[str, Any] = dict(result.outputs.get(AGENT_STAGE) or {})
    return out


class ChildAgent:
    """What a durable agent that can run as a child run gives: its workflow and its sub-agents'."""

    @property
    def workflow(self) -> Workflow:  # pragma: no cover - each integration's RunlogAgent defines it
        raise NotImplementedError

    def child_agents(self) -> Iterable[ChildAgent]:  # pragma: no cover - each integration defines it
        raise NotImplementedError


def workflows_of(root: ChildAgent) -> list[Workflow]:
    """The child workflows of ``root``'s sub-agents, theirs, and so on (each once), for ``App.of``."""
    out: dict[str, Workflow] = {}
    todo = list(root.child_agents())
    seen: set[int] = {id(root)}
    while todo:
        a = todo.pop(0)
        if id(a) in seen:
            continue
        seen.add(id(a))
        wf = a.workflow
        out.setdefault(wf.name, wf)
        todo.extend(a.child_agents())
    return list(out.values())
