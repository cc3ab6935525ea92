"""The application object a resumer (and the console's retry) needs: workflows, tools, inputs (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from producers.define._inputs import InputSource
from producers.define._tools import Tool
from producers.define._workflow import Workflow, WorkflowRegistry

__all__ = ["App"]


@dataclass(frozen=True)
class App:
    """What resume needs from an application: its workflows, its tools, its inputs.

    An application module exposes one (``runlog resumer --app module:attribute``).
    ``name`` names the application's resumer group (``<RUNLOG_RESUMER_GROUP>.<name>``);
    without it the group is named by a hash of the registered workflow names
    (:func:`processors.resume.app_id`).
    """

    registry: WorkflowRegistry
    tools: Mapping[str, Tool]
    source: InputSource
    name: str | None = None

    @classmethod
    def of(cls, workflows: Iterable[Workflow], tools: Iterable[Tool], source: InputSource, *,
           name: str | None = None) -> App:
        return cls(WorkflowRegistry(workflows), {t.name: t for t in tools}, source, name)
