"""A toy workflow whose stage code diverges on every replay (a model prompt built from
``random.random()`` instead of ``ctx.random()``), crashed in-process like :mod:`._toy`.

Its one stage calls the ``<name>_model`` tool with a fresh random number in the prompt, then
crashes (:class:`~tests.integration.resume._toy.Abandon`) while ``crashing``. A resume runs the
stage again: the model call's request differs from the recorded one, so the determinism guard
appends ``CALL_DIVERGED`` and ``RUN_BLOCKED`` without calling the model. ``calls`` counts every
real model call.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from runlog.processors.resume import App
from runlog.producers import DictInputSource, Runner, Tool, Workflow, rule, tool
from runlog.schemas import Settings
from tests.integration.resume._toy import Abandon

__all__ = ["Diverging", "crash_diverging", "diverging"]


@dataclass
class Diverging:
    name: str
    workflow: Workflow
    tools: tuple[Tool, ...]
    calls: Counter[str] = field(default_factory=Counter)
    crashing: bool = True

    def app(self) -> App:
        return App.of([self.workflow], list(self.tools), DictInputSource({}), name=self.name)


def diverging(name: str) -> Diverging:
    wf = Workflow(name, "1")

    @tool(f"{name}_model")
    def model(call: Any, prompt: str) -> dict[str, Any]:
        d.calls["model"] += 1
        return {"text": f"answer to {prompt}"}

    d = Diverging(name, wf, (model,))

    @wf.stage("draft", rules=[rule("text.set", lambda o: bool(o.get("text")))])
    def draft(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        # random.random(), not ctx.random(): the prompt differs on every replay
        text = ctx.call(model, prompt=f"{ctx.params['q']} (temperature {random.random():.6f})")["text"]
        if d.crashing:
            raise Abandon(f"{name}: crashed after the model call")
        return {"text": text}

    return d


def crash_diverging(settings: Settings, d: Diverging, q: str = "write a haiku") -> str:
    """Start a run of ``d``, crash it right after its model call (lease left to expire); its id."""
    d.crashing = True
    runner = Runner.from_settings(settings, source=DictInputSource({}))
    try:
        h = runner.start_run(d.workflow, {"q": q})
        assert h.session is not None
        try:
            runner.execute(h.session, release=False)
        except Abandon:
            pass
        else:  # pragma: no cover - the stage always raises while crashing
            raise AssertionError("the diverging run did not crash")
    finally:
        runner.close()  # stops the heartbeat: the lease expires after its ttl
        d.crashing = False
    return h.run_id
