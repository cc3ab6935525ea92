"""The bench application: the workflow the synthetic histories were written by, for the resumer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runlog.processors.bench._events import WORKFLOW
from runlog.processors.resume import App
from runlog.producers import DictInputSource, StageContext, Workflow

__all__ = ["app", "workflow"]


def workflow() -> Workflow:
    """``bench@1``: stages ``work`` and ``finish``, each returning a small output at once."""
    wf = Workflow(WORKFLOW.name, WORKFLOW.version)

    @wf.stage("work")
    def work(ctx: StageContext, inputs: Mapping[str, Any]) -> dict[str, Any]:
        return {"ok": True}

    @wf.stage("finish")
    def finish(ctx: StageContext, inputs: Mapping[str, Any]) -> dict[str, Any]:
        return {"done": True}

    return wf


def app() -> App:
    """The bench :class:`~runlog.processors.resume.App` (``--app runlog.processors.bench._app:app``)."""
    return App.of([workflow()], [], DictInputSource({}))
